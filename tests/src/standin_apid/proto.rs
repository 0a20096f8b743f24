//! The messages of tests/proto/standin.proto, written by hand for prost
//! (no protoc), the method paths, and Read's payload.

/// Every request that carries nothing.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// Version's reply.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionReply {
    /// The roles apid settled on for the call, sorted.
    #[prost(string, repeated, tag = "1")]
    pub roles: Vec<String>,
    /// The roles of the client certificate's Subject Organization, sorted.
    #[prost(string, repeated, tag = "2")]
    pub certificate_roles: Vec<String>,
}

/// Reboot's and Reset's reply.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Done {
    #[prost(string, tag = "1")]
    pub action: String,
    #[prost(string, repeated, tag = "2")]
    pub roles: Vec<String>,
}

/// One line of Logs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LogLine {
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    #[prost(string, tag = "2")]
    pub text: String,
}

/// Bytes, in either direction.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Chunk {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
}

/// EtcdRecover's reply.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Count {
    #[prost(uint64, tag = "1")]
    pub bytes: u64,
    #[prost(uint64, tag = "2")]
    pub messages: u64,
}

pub const VERSION: &str = "/machine.MachineService/Version";
pub const REBOOT: &str = "/machine.MachineService/Reboot";
pub const RESET: &str = "/machine.MachineService/Reset";
pub const ROLLBACK: &str = "/machine.MachineService/Rollback";
pub const LOGS: &str = "/machine.MachineService/Logs";
pub const READ: &str = "/machine.MachineService/Read";
pub const ETCD_RECOVER: &str = "/machine.MachineService/EtcdRecover";
pub const ETCD_SNAPSHOT: &str = "/machine.MachineService/EtcdSnapshot";
pub const CONTAINER_RUN: &str = "/machine.DebugService/ContainerRun";

/// Read's one message carries this much data: Talos takes messages up to
/// 32 MiB, and this one, encoded, is just under.
pub const READ_DATA_LEN: usize = 32 * 1024 * 1024 - 64;

/// EtcdSnapshot's one message carries this much data (a small etcd
/// database stands in for a real one).
pub const SNAPSHOT_DATA_LEN: usize = 64 * 1024;

/// Rollback's status message: non-ASCII, so percent-encoded on the wire.
pub const ROLLBACK_MESSAGE: &str = "nothing to roll back: état";

/// Byte `i` of any pattern the tests send or Read answers: `i mod 251`, a
/// prime, so that a lost, repeated or shifted piece changes the digest.
pub fn pattern(offset: usize, len: usize) -> Vec<u8> {
    (offset..offset + len).map(|i| (i % 251) as u8).collect()
}

/// Read's one message as it goes on the wire (what a client receives and
/// hashes).
pub fn read_message() -> Vec<u8> {
    prost::Message::encode_to_vec(&Chunk {
        data: pattern(0, READ_DATA_LEN),
    })
}
