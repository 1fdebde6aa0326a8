//! One-sided regions as the protocol core sees them: a context's registrations and their
//! grants (`registry.rs`), what an import
//! answered (`imported.rs`) and the checks of a transfer's spans that both sides run
//! (`spans.rs`). The key a registration ships is `remote_key.rs`; the user's handles on top of these are `onesided/`.

mod imported;
mod registry;
mod spans;

pub use crate::remote_key::{Access, KeyError, MemoryKind, RemoteKey, KEY_LEN};
pub(crate) use imported::ImportedRegion;
pub(crate) use registry::{RegistrationInner, Registry};
pub(crate) use spans::{check_initiator_transfer, check_spans};
