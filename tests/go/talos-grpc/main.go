// Command talos-grpc stands in for talosctl's transport: gRPC over the
// HTTP/2 client of Go's standard library (net/http) and crypto/tls, the
// stack under talosctl's grpc-go, with a talosconfig context's key and
// certificate (tls.X509KeyPair: Ed25519 as talos-sso writes it) and its
// `ca` as the only roots.
//
// gRPC by hand: each message framed as one flag byte (0, uncompressed)
// and a 4-byte big-endian length; request metadata as headers
// (content-type application/grpc, te trailers, then every --md); the
// status from the trailers, or from the headers of a trailers-only
// answer, grpc-message percent-decoded; without grpc-status, the HTTP
// status mapped as gRPC does.
//
// Usage:
//
//	talos-grpc --endpoint HOST:PORT [--server-name N] --ca F --crt F --key F
//	  --method /pkg.Service/Method [--md key=value]... [--timeout D]
//	  --mode unary          [--request BASE64]
//	  --mode server-stream  [--request BASE64] [--count N]  N messages, then
//	                        close the body (RST_STREAM CANCEL); 0: to the end
//	  --mode client-stream  --bytes K   K bytes as Chunk messages of 64 KiB
//	  --mode bidi           [--send BASE64]...  then the end, read to the end
//
// It prints one JSON line: code, message, message_raw, headers, trailers
// ([key, value] pairs), sizes, messages (base64, when 1 MiB or less in
// all), sha256 (of all messages), error (a failure below gRPC).
//
// Standard library only, no module file: it builds offline with any Go
// from 1.19 on.
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	chunk        = 64 * 1024
	keepMessages = 1024 * 1024
	maxMessage   = 64 * 1024 * 1024
	codeCanceled = 1
	codeUnknown  = 2
	codeInternal = 13
	codeUnavail  = 14
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

type outcome struct {
	Code       int         `json:"code"`
	Message    string      `json:"message"`
	MessageRaw *string     `json:"message_raw"`
	Headers    [][2]string `json:"headers"`
	Trailers   [][2]string `json:"trailers"`
	Sizes      []int       `json:"sizes"`
	Messages   []string    `json:"messages"`
	Sha256     string      `json:"sha256"`
	Error      *string     `json:"error"`

	digest hash.Hash
	total  int
}

type options struct {
	endpoint, serverName, ca, crt, key, method, mode, request string
	metadata, sends                                           list
	count, bytes                                              int
	timeout                                                   time.Duration
}

func main() {
	var o options
	flags := flag.NewFlagSet("talos-grpc", flag.ExitOnError)
	flags.StringVar(&o.endpoint, "endpoint", "", "HOST:PORT")
	flags.StringVar(&o.serverName, "server-name", "", "name or IP the server certificate must hold")
	flags.StringVar(&o.ca, "ca", "", "PEM file: the CAs that verify the server")
	flags.StringVar(&o.crt, "crt", "", "PEM file: the client certificate (chain)")
	flags.StringVar(&o.key, "key", "", "PEM file: its private key")
	flags.StringVar(&o.method, "method", "", "/package.Service/Method")
	flags.StringVar(&o.mode, "mode", "unary", "unary, server-stream, client-stream or bidi")
	flags.StringVar(&o.request, "request", "", "base64 of the request message")
	flags.Var(&o.metadata, "md", "key=value, repeatable")
	flags.Var(&o.sends, "send", "base64 of a bidi request message, repeatable")
	flags.IntVar(&o.count, "count", 0, "server-stream: messages to read before cancelling (0: all)")
	flags.IntVar(&o.bytes, "bytes", 0, "client-stream: bytes to send")
	flags.DurationVar(&o.timeout, "timeout", 50*time.Second, "for the whole call")
	if err := flags.Parse(os.Args[1:]); err != nil {
		fail(err)
	}
	out := newOutcome()
	if err := call(&o, out); err != nil {
		text := err.Error()
		out.Error = &text
		if out.Code == 0 {
			out.Code = codeUnavail
			out.Message = text
		}
	}
	if out.total > keepMessages {
		out.Messages = []string{}
	}
	out.Sha256 = hex.EncodeToString(out.digest.Sum(nil))
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(2)
}

func newOutcome() *outcome {
	return &outcome{
		Headers:  [][2]string{},
		Trailers: [][2]string{},
		Sizes:    []int{},
		Messages: []string{},
		digest:   sha256.New(),
	}
}

// requests are the messages the call sends, encoded.
func requests(o *options) ([][]byte, error) {
	switch o.mode {
	case "unary", "server-stream":
		request, err := base64.StdEncoding.DecodeString(o.request)
		return [][]byte{request}, err
	case "client-stream":
		var messages [][]byte
		for offset := 0; offset < o.bytes; offset += chunk {
			n := o.bytes - offset
			if n > chunk {
				n = chunk
			}
			messages = append(messages, chunkMessage(offset, n))
		}
		return messages, nil
	case "bidi":
		var messages [][]byte
		for _, send := range o.sends {
			message, err := base64.StdEncoding.DecodeString(send)
			if err != nil {
				return nil, err
			}
			messages = append(messages, message)
		}
		return messages, nil
	}
	return nil, fmt.Errorf("unknown mode %q", o.mode)
}

// chunkMessage is the stand-in's Chunk{data}: field 1, length-delimited,
// byte i of the data being (offset+i) mod 251.
func chunkMessage(offset, n int) []byte {
	message := []byte{0x0a}
	var length [binary.MaxVarintLen64]byte
	message = append(message, length[:binary.PutUvarint(length[:], uint64(n))]...)
	for i := 0; i < n; i++ {
		message = append(message, byte((offset+i)%251))
	}
	return message
}

func frame(message []byte) []byte {
	framed := make([]byte, 5, 5+len(message))
	binary.BigEndian.PutUint32(framed[1:], uint32(len(message)))
	return append(framed, message...)
}

func transport(o *options) (*http.Transport, error) {
	cert, err := tls.LoadX509KeyPair(o.crt, o.key)
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(o.ca)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no CA certificate in --ca")
	}
	serverName := o.serverName
	if serverName == "" {
		serverName = strings.Split(o.endpoint, ":")[0]
	}
	return &http.Transport{
		TLSClientConfig: &tls.Config{
			Certificates: []tls.Certificate{cert},
			RootCAs:      roots,
			ServerName:   serverName,
			NextProtos:   []string{"h2"},
			MinVersion:   tls.VersionTLS12,
		},
		ForceAttemptHTTP2:  true,
		DisableCompression: true,
	}, nil
}

func call(o *options, out *outcome) error {
	messages, err := requests(o)
	if err != nil {
		return err
	}
	tr, err := transport(o)
	if err != nil {
		return err
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()

	// A pipe, so that no content-length is sent (as grpc-go sends none)
	// and a client stream goes out message by message.
	body, writer := io.Pipe()
	go func() {
		for _, message := range messages {
			if _, err := writer.Write(frame(message)); err != nil {
				return
			}
		}
		writer.Close()
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+o.endpoint+o.method, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	req.Header.Set("User-Agent", "talos-grpc")
	for _, pair := range o.metadata {
		key, value, found := strings.Cut(pair, "=")
		if !found {
			return fmt.Errorf("--md %q: want key=value", pair)
		}
		req.Header.Add(key, value)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()

	trailersOnly := resp.Header.Get("Grpc-Status") != ""
	if trailersOnly {
		out.Trailers = metadata(resp.Header)
	} else {
		out.Headers = metadata(resp.Header)
	}
	if resp.StatusCode != http.StatusOK {
		out.Code = httpCode(resp.StatusCode)
		out.Message = "HTTP status " + strconv.Itoa(resp.StatusCode)
		return nil
	}
	if trailersOnly {
		return status(resp.Header, out)
	}
	for o.mode != "server-stream" || o.count == 0 || len(out.Sizes) < o.count {
		message, err := readMessage(resp.Body)
		if err == io.EOF {
			out.Trailers = metadata(resp.Trailer)
			return status(resp.Trailer, out)
		}
		if err != nil {
			out.Code = codeInternal
			out.Message = err.Error()
			return err
		}
		out.receive(message)
	}
	// Enough: closing the body unread resets the stream (CANCEL).
	resp.Body.Close()
	out.Code = codeCanceled
	out.Message = "cancelled by the client"
	return nil
}

func readMessage(body io.Reader) ([]byte, error) {
	var prefix [5]byte
	if _, err := io.ReadFull(body, prefix[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return nil, errors.New("the stream ended inside a message prefix")
		}
		return nil, err
	}
	if prefix[0] != 0 {
		return nil, fmt.Errorf("compressed flag %d: no compression was offered", prefix[0])
	}
	length := binary.BigEndian.Uint32(prefix[1:])
	if length > maxMessage {
		return nil, fmt.Errorf("message of %d bytes: more than %d", length, maxMessage)
	}
	message := make([]byte, length)
	if _, err := io.ReadFull(body, message); err != nil {
		return nil, fmt.Errorf("the stream ended inside a message: %w", err)
	}
	return message, nil
}

func (out *outcome) receive(message []byte) {
	out.Sizes = append(out.Sizes, len(message))
	out.digest.Write(message)
	out.total += len(message)
	if out.total <= keepMessages {
		out.Messages = append(out.Messages, base64.StdEncoding.EncodeToString(message))
	}
}

// status reads grpc-status and grpc-message from the trailers (or the
// headers of a trailers-only answer).
func status(fields http.Header, out *outcome) error {
	code := fields.Get("Grpc-Status")
	if code == "" {
		out.Code = codeInternal
		out.Message = "the stream ended without grpc-status"
		return nil
	}
	n, err := strconv.Atoi(code)
	if err != nil {
		out.Code = codeUnknown
		out.Message = "grpc-status " + strconv.Quote(code)
		return nil
	}
	out.Code = n
	if values, found := fields["Grpc-Message"]; found && len(values) > 0 {
		raw := values[0]
		out.MessageRaw = &raw
		out.Message = percentDecode(raw)
	}
	return nil
}

// percentDecode undoes gRPC's percent-encoding of grpc-message; a `%` not
// followed by two hex digits stays as it is.
func percentDecode(s string) string {
	var decoded []byte
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if b, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				decoded = append(decoded, byte(b))
				i += 2
				continue
			}
		}
		decoded = append(decoded, s[i])
	}
	return string(decoded)
}

// metadata lists header fields as lower-case [key, value] pairs, keys
// sorted, without the status's own.
func metadata(fields http.Header) [][2]string {
	keys := make([]string, 0, len(fields))
	for key := range fields {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	pairs := [][2]string{}
	for _, key := range keys {
		lower := strings.ToLower(key)
		if lower == "grpc-status" || lower == "grpc-message" {
			continue
		}
		for _, value := range fields[key] {
			pairs = append(pairs, [2]string{lower, value})
		}
	}
	return pairs
}

// httpCode maps an HTTP status without grpc-status as gRPC does.
func httpCode(status int) int {
	switch status {
	case http.StatusBadRequest:
		return codeInternal
	case http.StatusUnauthorized:
		return 16
	case http.StatusForbidden:
		return 7
	case http.StatusNotFound:
		return 12
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return codeUnavail
	}
	return codeUnknown
}
