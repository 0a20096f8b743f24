//! The Talos machine API as talos-sso's gateway sees it: which methods
//! change a node (`methods`, Talos's own table), the per-method rules a
//! gateway cluster adds (`rules`), and the `api.call` records of the trail
//! (`calls`). Pure: the gateway (`crate::gateway`) serves and forwards.

pub mod calls;
pub mod methods;
pub mod rules;
