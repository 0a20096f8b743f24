//! The console's views, one file each: the trail (newest first, filtered,
//! a cursor that stays put while records arrive), one record with its
//! place in the chain, who held a role, one person, the chain status,
//! charts, exports and, for admins, the deny list. Each reads through the
//! audit store as the API does (no SQL here), after [`super::viewer`] and
//! [`super::record_view`]; `common` holds what several of them share.

mod chain;
mod charts;
mod common;
mod deny;
mod export;
mod held;
mod person;
mod record;
mod trail;
mod workload;

pub use chain::{CsrfForm, chain, verify_again};
pub use charts::{CHART_DAYS_MAX, CHART_HOURS_MAX, ChartCache, ChartQuery, charts};
pub use common::{Filters, Look, PAGE};
pub use deny::{Change, DenyForm, deny_add, deny_list, deny_remove, refused_form};
pub use export::{EXPORT_MAX, EXPORT_PAGE, ended, export};
pub use held::{HeldQuery, held};
pub use person::{PersonQuery, person};
pub use record::record;
pub use trail::trail;
