//! One-sided regions as the protocol core sees them: one registration's memory and what
//! it grants (`registration.rs`), a context's registrations and their grants
//! (`registry.rs`, shared by the user's threads and the lanes), what an import answered
//! (`imported.rs`), and the checks of a transfer's spans that both sides run
//! (`spans.rs`). The key a registration ships is `remote_key.rs`; the user's handles are
//! the transport's.

mod imported;
mod registration;
mod registry;
mod spans;

pub use crate::remote_key::{Access, KeyError, MemoryKind, RemoteKey, KEY_LEN};
pub use imported::ImportedRegion;
pub use registration::RegistrationInner;
pub use registry::{counted_ids, Registry};
pub use spans::{check_initiator_transfer, check_spans};
