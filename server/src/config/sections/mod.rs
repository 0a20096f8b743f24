//! The sections of the configuration file, one file per concern: plain
//! serde data with a doc comment per key (docs/configuration.md documents
//! every one).

mod audit;
mod cluster;
mod cluster_ca;
mod gateway;
mod identity;
mod policy;
mod runtime;
mod serving;

pub use audit::*;
pub use cluster::*;
pub use cluster_ca::*;
pub use gateway::*;
pub use identity::*;
pub use policy::*;
pub use runtime::*;
pub use serving::*;
