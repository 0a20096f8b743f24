// Command talos-tls stands in for Talos's apid and talosctl with Go's own
// standard library (crypto/tls, crypto/x509), the code Talos itself runs,
// so that the certificates talos-sso makes are judged by the verifier that
// will judge them in production rather than by one written for the tests.
//
// It follows, in Talos's sources:
//   - internal/app/apid/service.go and the crypto module's TLS provider
//     (crypto/tls): apid's server config: MinVersion TLS 1.2, NextProtos h2,
//     ClientAuth RequireAndVerifyClientCert with ClientCAs = machine.ca plus
//     machine.acceptedCAs, and VerifyPeerCertificate = verifyExtKeyUsage
//     (every non-CA certificate of verifiedChains[0] has extended key usage
//     exactly [ClientAuth]); roles are the leaf's Subject Organization
//     values, trimmed, empty ones dropped (pkg/machinery/role.Parse).
//   - pkg/machinery/client/connection.go: talosctl's client config: RootCAs
//     from the talosconfig `ca` (AppendCertsFromPEM, several CAs allowed),
//     the client certificate from `crt`/`key` through tls.X509KeyPair,
//     NextProtos h2.
//
// Subcommands:
//
//	verify   -roots F -chain F -usage client|server
//	apid     -listen ADDR -cert F -key F -client-ca F
//	talosctl -endpoint HOST:PORT -ca F -crt F -key F [-server-name N] [-timeout D]
//
// Standard library only, no module file: it builds offline with any Go
// from 1.19 on.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: talos-tls verify|apid|talosctl [flags]"))
	}
	var err error
	switch os.Args[1] {
	case "verify":
		err = verify(os.Args[2:])
	case "apid":
		err = apid(os.Args[2:])
	case "talosctl":
		err = talosctl(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// certificates reads every CERTIFICATE block of a PEM file, in order.
func certificates(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%s: no CERTIFICATE block", path)
	}
	return certs, nil
}

// pool is what Talos and talosctl build from PEM text: AppendCertsFromPEM.
func pool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	certs := x509.NewCertPool()
	if !certs.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s: no certificate to trust", path)
	}
	return certs, nil
}

// verify checks the chain's first certificate against the roots, with the
// rest as intermediates, for one extended key usage.
func verify(args []string) error {
	flags := flag.NewFlagSet("verify", flag.ContinueOnError)
	roots := flags.String("roots", "", "PEM file of trusted CAs")
	chain := flags.String("chain", "", "PEM file: the certificate, then intermediates")
	usage := flags.String("usage", "client", "client or server")
	if err := flags.Parse(args); err != nil {
		return err
	}
	var keyUsage x509.ExtKeyUsage
	switch *usage {
	case "client":
		keyUsage = x509.ExtKeyUsageClientAuth
	case "server":
		keyUsage = x509.ExtKeyUsageServerAuth
	default:
		return fmt.Errorf("-usage must be client or server, not %q", *usage)
	}
	rootPool, err := pool(*roots)
	if err != nil {
		return err
	}
	certs, err := certificates(*chain)
	if err != nil {
		return err
	}
	intermediates := x509.NewCertPool()
	for _, cert := range certs[1:] {
		intermediates.AddCert(cert)
	}
	_, err = certs[0].Verify(x509.VerifyOptions{
		Roots:         rootPool,
		Intermediates: intermediates,
		KeyUsages:     []x509.ExtKeyUsage{keyUsage},
	})
	if err != nil {
		return err
	}
	fmt.Println("ok")
	return nil
}

// verifyExtKeyUsage is apid's check after the chain's: every certificate
// of the verified chain that is not a CA has extended key usage exactly
// [ClientAuth].
func verifyExtKeyUsage(_ [][]byte, verifiedChains [][]*x509.Certificate) error {
	if len(verifiedChains) == 0 {
		return errors.New("no verified chains")
	}
	for _, cert := range verifiedChains[0] {
		if cert.IsCA {
			continue
		}
		if len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
			return fmt.Errorf("certificate %q: extended key usage must be exactly [ClientAuth], got %v",
				cert.Subject, cert.ExtKeyUsage)
		}
	}
	return nil
}

// roles is role.Parse over the leaf's Subject Organization values.
func roles(leaf *x509.Certificate) []string {
	var parsed []string
	for _, o := range leaf.Subject.Organization {
		if o = strings.TrimSpace(o); o != "" {
			parsed = append(parsed, o)
		}
	}
	return parsed
}

// apid serves TLS as apid does; each connection that completes the
// handshake gets one line, the roles separated by commas, and is closed.
func apid(args []string) error {
	flags := flag.NewFlagSet("apid", flag.ContinueOnError)
	listen := flags.String("listen", "127.0.0.1:0", "address to listen on")
	certFile := flags.String("cert", "", "PEM file: the server certificate (and chain)")
	keyFile := flags.String("key", "", "PEM file: the server key")
	clientCA := flags.String("client-ca", "", "PEM file: machine.ca and machine.acceptedCAs")
	if err := flags.Parse(args); err != nil {
		return err
	}
	identity, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		return err
	}
	clientCAs, err := pool(*clientCA)
	if err != nil {
		return err
	}
	config := &tls.Config{
		MinVersion:             tls.VersionTLS12,
		NextProtos:             []string{"h2"},
		SessionTicketsDisabled: true,
		Certificates:           []tls.Certificate{identity},
		ClientAuth:             tls.RequireAndVerifyClientCert,
		ClientCAs:              clientCAs,
		VerifyPeerCertificate:  verifyExtKeyUsage,
	}
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Println(listener.Addr().String())
	for {
		conn, err := listener.Accept()
		if err != nil {
			return err
		}
		go serve(tls.Server(conn, config))
	}
}

func serve(conn *tls.Conn) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := conn.Handshake(); err != nil {
		fmt.Fprintf(os.Stderr, "refused: %v\n", err)
		return
	}
	state := conn.ConnectionState()
	if len(state.PeerCertificates) == 0 {
		fmt.Fprintln(os.Stderr, "refused: no client certificate")
		return
	}
	fmt.Fprintf(os.Stderr, "admitted: %v\n", state.PeerCertificates[0].Subject)
	fmt.Fprintf(conn, "%s\n", strings.Join(roles(state.PeerCertificates[0]), ","))
}

// talosctl connects as talosctl does and prints the line apid sent.
func talosctl(args []string) error {
	flags := flag.NewFlagSet("talosctl", flag.ContinueOnError)
	endpoint := flags.String("endpoint", "", "host:port of the apid stand-in")
	caFile := flags.String("ca", "", "PEM file: the talosconfig ca")
	crtFile := flags.String("crt", "", "PEM file: the talosconfig crt")
	keyFile := flags.String("key", "", "PEM file: the talosconfig key")
	serverName := flags.String("server-name", "", "name to verify (default: the endpoint's host)")
	timeout := flags.Duration("timeout", 10*time.Second, "for the whole exchange")
	if err := flags.Parse(args); err != nil {
		return err
	}
	rootCAs, err := pool(*caFile)
	if err != nil {
		return err
	}
	crt, err := os.ReadFile(*crtFile)
	if err != nil {
		return err
	}
	key, err := os.ReadFile(*keyFile)
	if err != nil {
		return err
	}
	identity, err := tls.X509KeyPair(crt, key)
	if err != nil {
		return err
	}
	name := *serverName
	if name == "" {
		if name, _, err = net.SplitHostPort(*endpoint); err != nil {
			return err
		}
	}
	config := &tls.Config{
		RootCAs:      rootCAs,
		Certificates: []tls.Certificate{identity},
		NextProtos:   []string{"h2"},
		ServerName:   name,
	}
	dialer := &net.Dialer{Timeout: *timeout}
	conn, err := tls.DialWithDialer(dialer, "tcp", *endpoint, config)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(*timeout))
	// With TLS 1.3 the server judges the client certificate after the
	// client's handshake is done: the refusal arrives on the first read.
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading apid's answer: %w", err)
	}
	fmt.Print(line)
	return nil
}
