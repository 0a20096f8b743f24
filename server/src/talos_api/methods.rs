//! Which Talos API methods change a node: the table the gateway records by.
//!
//! Talos authorizes each machine API method by role (machined's `rules`
//! map, with `os:admin` for any method it does not list). Talos gives
//! `os:reader` only what reads a node; so a method open to `os:reader` is
//! [`MethodClass::Read`], and every other one, listed or not, is
//! [`MethodClass::Mutating`]: recorded before it is forwarded. That includes
//! methods that read secrets (`Read`, `Kubeconfig`, `EtcdSnapshot`), which
//! Talos keeps from readers too. Five methods take `os:reader` only in
//! maintenance mode (checked in their handlers): they are mutating here, and
//! the table lists their roles without it.
//!
//! Taken from siderolabs/talos at ad8823176e75 (2026-08-21),
//! `internal/app/machined/pkg/system/services/machined.go`. When Talos
//! adds a method, it is mutating here until the table lists it: the safe
//! side, a record before the call.

/// How the gateway records a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodClass {
    /// Open to `os:reader`: recorded when it ends, counted per minute.
    Read,
    /// Anything else: recorded before it is forwarded, and when it ends.
    Mutating,
    /// A read that may return secrets: the COSI state reads by an
    /// `os:admin` caller (Talos returns machine configs and secret
    /// resources to admins only). Recorded as a mutating call is.
    Sensitive,
}

impl MethodClass {
    /// As recorded (`details.class`).
    pub fn as_str(self) -> &'static str {
        match self {
            MethodClass::Read => talos_sso_api::audit::api_call::CLASS_READ,
            MethodClass::Mutating => talos_sso_api::audit::api_call::CLASS_MUTATING,
            MethodClass::Sensitive => talos_sso_api::audit::api_call::CLASS_SENSITIVE,
        }
    }

    /// Recorded before it is forwarded (no record, no call).
    pub fn recorded_before(self) -> bool {
        self != MethodClass::Read
    }
}

use MethodClass::{Mutating, Read};

/// Talos's roles per method, and the class that follows from them.
pub const TALOS_METHODS: &[(&str, MethodClass, &[&str])] = &[
    (
        "/cluster.ClusterService/HealthCheck",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/inspect.InspectService/ControllerRuntimeDependencies",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    ("/machine.ImageService/Import", Mutating, &["os:admin"]),
    (
        "/machine.ImageService/List",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.ImageService/Pull",
        Mutating,
        &["os:admin", "os:operator"],
    ),
    ("/machine.ImageService/Remove", Mutating, &["os:admin"]),
    (
        "/machine.ImageService/Verify",
        Read,
        &["os:admin", "os:operator", "os:reader", "os:image:verifier"],
    ),
    ("/machine.DebugService/ContainerRun", Mutating, &["os:admin"]),
    ("/machine.LifecycleService/Install", Mutating, &["os:admin"]),
    ("/machine.LifecycleService/Upgrade", Mutating, &["os:admin"]),
    (
        "/machine.StorageService/Statfs",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/ApplyConfiguration",
        Mutating,
        &["os:admin"],
    ), // os:reader only in maintenance mode
    ("/machine.MachineService/Bootstrap", Mutating, &["os:admin"]),
    (
        "/machine.MachineService/CPUInfo",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/CPUFreqStats",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/Containers",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    ("/machine.MachineService/Copy", Mutating, &["os:admin"]),
    (
        "/machine.MachineService/DiskStats",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/DiskUsage",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/Dmesg",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/EtcdAlarmList",
        Read,
        &["os:admin", "os:operator", "os:reader", "os:etcd:backup"],
    ),
    (
        "/machine.MachineService/EtcdAlarmDisarm",
        Mutating,
        &["os:admin", "os:operator"],
    ),
    (
        "/machine.MachineService/EtcdDefragment",
        Mutating,
        &["os:admin", "os:operator"],
    ),
    (
        "/machine.MachineService/EtcdForfeitLeadership",
        Mutating,
        &["os:admin"],
    ),
    (
        "/machine.MachineService/EtcdLeaveCluster",
        Mutating,
        &["os:admin"],
    ),
    (
        "/machine.MachineService/EtcdMemberList",
        Read,
        &["os:admin", "os:operator", "os:reader", "os:etcd:backup"],
    ),
    ("/machine.MachineService/EtcdRecover", Mutating, &["os:admin"]),
    (
        "/machine.MachineService/EtcdRemoveMemberByID",
        Mutating,
        &["os:admin"],
    ),
    (
        "/machine.MachineService/EtcdSnapshot",
        Mutating,
        &["os:admin", "os:operator", "os:etcd:backup"],
    ),
    (
        "/machine.MachineService/EtcdStatus",
        Read,
        &["os:admin", "os:operator", "os:reader", "os:etcd:backup"],
    ),
    (
        "/machine.MachineService/EtcdDowngradeCancel",
        Mutating,
        &["os:admin"],
    ),
    (
        "/machine.MachineService/EtcdDowngradeEnable",
        Mutating,
        &["os:admin"],
    ),
    (
        "/machine.MachineService/EtcdDowngradeValidate",
        Mutating,
        &["os:admin"],
    ),
    (
        "/machine.MachineService/Events",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/GenerateClientConfiguration",
        Mutating,
        &["os:admin"],
    ),
    (
        "/machine.MachineService/Hostname",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/ImageList",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/ImagePull",
        Mutating,
        &["os:admin", "os:operator"],
    ),
    ("/machine.MachineService/Kubeconfig", Mutating, &["os:admin"]),
    (
        "/machine.MachineService/List",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/LoadAvg",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/Logs",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/LogsContainers",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/Memory",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/MetaWrite",
        Mutating,
        &["os:admin", "os:meta:writer"],
    ),
    (
        "/machine.MachineService/MetaDelete",
        Mutating,
        &["os:admin", "os:meta:writer"],
    ),
    (
        "/machine.MachineService/Mounts",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/NetworkDeviceStats",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/Netstat",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/PacketCapture",
        Mutating,
        &["os:admin", "os:operator"],
    ),
    (
        "/machine.MachineService/Processes",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    ("/machine.MachineService/Read", Mutating, &["os:admin"]),
    (
        "/machine.MachineService/Reboot",
        Mutating,
        &["os:admin", "os:operator"],
    ),
    ("/machine.MachineService/Reset", Mutating, &["os:admin"]),
    (
        "/machine.MachineService/Restart",
        Mutating,
        &["os:admin", "os:operator"],
    ),
    ("/machine.MachineService/Rollback", Mutating, &["os:admin"]),
    (
        "/machine.MachineService/ServiceList",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/ServiceRestart",
        Mutating,
        &["os:admin", "os:operator"],
    ),
    (
        "/machine.MachineService/ServiceStart",
        Mutating,
        &["os:admin", "os:operator"],
    ),
    (
        "/machine.MachineService/ServiceStop",
        Mutating,
        &["os:admin", "os:operator"],
    ),
    (
        "/machine.MachineService/Shutdown",
        Mutating,
        &["os:admin", "os:operator"],
    ),
    (
        "/machine.MachineService/Stats",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/machine.MachineService/SystemStat",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    ("/machine.MachineService/Upgrade", Mutating, &["os:admin"]),
    (
        "/machine.MachineService/Version",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    ("/cosi.resource.State/Create", Mutating, &["os:admin"]),
    ("/cosi.resource.State/Destroy", Mutating, &["os:admin"]),
    ("/cosi.resource.State/Teardown", Mutating, &["os:admin"]),
    ("/cosi.resource.State/TeardownAndDestroy", Mutating, &["os:admin"]),
    (
        "/cosi.resource.State/Get",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/cosi.resource.State/List",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    ("/cosi.resource.State/Update", Mutating, &["os:admin"]),
    (
        "/cosi.resource.State/Watch",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/storage.StorageService/Disks",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    ("/storage.StorageService/BlockDeviceWipe", Mutating, &["os:admin"]), // os:reader only in maintenance mode
    ("/machine.LVMService/LogicalVolumeRemove", Mutating, &["os:admin"]), // os:reader only in maintenance mode
    ("/machine.LVMService/VolumeGroupRemove", Mutating, &["os:admin"]), // os:reader only in maintenance mode
    (
        "/machine.LVMService/PhysicalVolumeRemove",
        Mutating,
        &["os:admin"],
    ), // os:reader only in maintenance mode
    ("/machine.MDService/Destroy", Mutating, &["os:admin"]),            // os:reader only in maintenance mode
    (
        "/time.TimeService/Time",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
    (
        "/time.TimeService/TimeCheck",
        Read,
        &["os:admin", "os:operator", "os:reader"],
    ),
];

/// The COSI state service: its reads return secret resources to admins.
const COSI_STATE: &str = "/cosi.resource.State/";

/// The class of a call of a full method name
/// (`/machine.MachineService/Reboot`) by a caller with `roles`.
pub fn classify(method: &str, roles: &[String]) -> MethodClass {
    let class = TALOS_METHODS
        .iter()
        .find(|(name, _, _)| *name == method)
        .map_or(Mutating, |(_, class, _)| *class);
    if class == Read && method.starts_with(COSI_STATE) && roles.iter().any(|r| r == "os:admin") {
        return MethodClass::Sensitive;
    }
    class
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admin_s_cosi_reads_are_sensitive() {
        let admin = ["os:admin".to_owned()];
        let operator = ["os:operator".to_owned(), "os:reader".to_owned()];
        assert_eq!(
            classify("/cosi.resource.State/Get", &admin),
            MethodClass::Sensitive
        );
        assert_eq!(
            classify("/cosi.resource.State/Watch", &admin),
            MethodClass::Sensitive
        );
        assert_eq!(classify("/cosi.resource.State/Get", &operator), Read);
        assert_eq!(classify("/machine.MachineService/Version", &admin), Read);
        assert!(MethodClass::Sensitive.recorded_before() && Mutating.recorded_before());
        assert!(!Read.recorded_before());
    }

    #[test]
    fn reader_methods_are_read_and_the_rest_mutating() {
        assert_eq!(classify("/machine.MachineService/Version", &[]), Read);
        assert_eq!(classify("/machine.MachineService/Logs", &[]), Read);
        assert_eq!(classify("/cosi.resource.State/Watch", &[]), Read);
        assert_eq!(classify("/machine.MachineService/Reboot", &[]), Mutating);
        assert_eq!(classify("/machine.MachineService/Reset", &[]), Mutating);
        assert_eq!(
            classify("/machine.MachineService/EtcdRemoveMemberByID", &[]),
            Mutating
        );
        // Secrets are read by admins only: recorded before, like a change.
        assert_eq!(classify("/machine.MachineService/Read", &[]), Mutating);
        assert_eq!(classify("/machine.MachineService/Kubeconfig", &[]), Mutating);
        // Reader only in maintenance mode.
        assert_eq!(
            classify("/machine.MachineService/ApplyConfiguration", &[]),
            Mutating
        );
        assert_eq!(classify("/storage.StorageService/BlockDeviceWipe", &[]), Mutating);
        // Unknown to the table: the safe side.
        assert_eq!(classify("/machine.MachineService/SomethingNew", &[]), Mutating);
    }

    #[test]
    fn the_table_agrees_with_itself() {
        let mut seen = std::collections::BTreeSet::new();
        for (name, class, roles) in TALOS_METHODS {
            assert!(seen.insert(*name), "{name} listed twice");
            assert!(name.starts_with('/') && name.matches('/').count() == 2, "{name}");
            assert_eq!(*class == Read, roles.contains(&"os:reader"), "{name}");
            assert!(
                roles.contains(&"os:admin"),
                "{name}: Talos gives admins every method"
            );
        }
        assert_eq!(TALOS_METHODS.len(), 81);
    }
}
