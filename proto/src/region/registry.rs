//! The registrations of one context: what `Context::register` made, what peers imported,
//! and when memory may be let go.
//!
//! An entry lives while a user handle ([`crate::onesided::Registration`]) does, and after the last
//! handle went, until every peer that imported it confirmed the revocation or its
//! connection ended: a peer's copy through its mapping must never outlive the memory.
//! Registering the same memory again with the same access is a cache hit: the handle
//! shares the entry (and its key).

use super::registration::RegistrationInner;
use crate::payload::{MemoryIdentity, Payload};
use crate::remote_key::{Access, MemoryKind, RemoteKey};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

struct Entry<P: Payload> {
    inner: Arc<RegistrationInner<P>>,
    handles: usize,
    grants: usize,
    revoked: bool,
    identity: Option<(MemoryIdentity, Access)>,
}

struct State<P: Payload> {
    next_id: u64,
    entries: HashMap<u64, Entry<P>>,
    by_memory: HashMap<(MemoryIdentity, Access), u64>,
}

/// A context's registrations.
pub struct Registry<P: Payload> {
    /// Where the context id and the keys' secrets come from.
    random: fn() -> u64,
    context: [u8; 16],
    state: Mutex<State<P>>,
    cache_hits: AtomicU64,
}

impl<P: Payload> Registry<P> {
    /// An empty registry whose context id and keys' secrets come from `random` (the
    /// transport reads the kernel's random source; the core reads none).
    pub fn new(random: fn() -> u64) -> Arc<Registry<P>> {
        let mut context = [0u8; 16];
        context[..8].copy_from_slice(&random().to_le_bytes());
        context[8..].copy_from_slice(&random().to_le_bytes());
        Arc::new(Registry {
            random,
            context,
            state: Mutex::new(State { next_id: 1, entries: HashMap::new(), by_memory: HashMap::new() }),
            cache_hits: AtomicU64::new(0),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<P>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `frame` (checked by the caller) for `access`; a new handle on the same
    /// entry when that memory is registered with that access already.
    pub fn register(&self, frame: P::Frame, access: Access) -> Arc<RegistrationInner<P>> {
        let identity = P::identity(&frame).map(|i| (i, access));
        let mut state = self.state();
        if let Some(id) = identity.and_then(|i| state.by_memory.get(&i).copied()) {
            if let Some(entry) = state.entries.get_mut(&id).filter(|e| !e.revoked) {
                entry.handles += 1;
                self.cache_hits.fetch_add(1, Ordering::Relaxed);
                return entry.inner.clone();
            }
        }
        let id = state.next_id;
        state.next_id += 1;
        let memory = if P::is_device(&frame) { MemoryKind::Device } else { MemoryKind::Host };
        let key = RemoteKey {
            context: self.context,
            registration: id,
            secret: (self.random)(),
            len: P::frame_len(&frame) as u64,
            access,
            memory,
        };
        let inner = Arc::new(RegistrationInner { id, access, frame, key });
        if let Some(i) = identity {
            state.by_memory.insert(i, id);
        }
        state.entries.insert(id, Entry { inner: inner.clone(), handles: 1, grants: 0, revoked: false, identity });
        inner
    }

    /// A user handle of `id` went. Whether that revoked the registration (it was the
    /// last): peers that imported it are then to be told.
    pub fn release_handle(&self, id: u64) -> bool {
        let mut state = self.state();
        let Some(entry) = state.entries.get_mut(&id) else { return false };
        entry.handles = entry.handles.saturating_sub(1);
        if entry.handles > 0 {
            return false;
        }
        entry.revoked = true;
        let (grants, identity) = (entry.grants, entry.identity);
        if let Some(i) = identity {
            state.by_memory.remove(&i);
        }
        if grants == 0 {
            state.entries.remove(&id);
        }
        true
    }

    /// The registration `key` names, for a peer importing it (one more grant held); why
    /// not, when the key is not this context's, unknown, revoked or does not match.
    pub fn grant(&self, key: &RemoteKey) -> Result<Arc<RegistrationInner<P>>, String> {
        if key.context != self.context {
            return Err("the key was made by another context".into());
        }
        let mut state = self.state();
        let Some(entry) = state.entries.get_mut(&key.registration) else {
            return Err(format!("registration {} does not exist (any more)", key.registration));
        };
        if entry.revoked {
            return Err(format!("registration {} was revoked", key.registration));
        }
        if entry.inner.key != *key {
            return Err(format!("the key does not match registration {}", key.registration));
        }
        entry.grants += 1;
        Ok(entry.inner.clone())
    }

    /// A grant of `id` ended (the peer confirmed a revocation, gave the region up, or
    /// its connection ended): a revoked registration goes with its last grant.
    pub fn release_grant(&self, id: u64) {
        let mut state = self.state();
        let Some(entry) = state.entries.get_mut(&id) else { return };
        entry.grants = entry.grants.saturating_sub(1);
        if entry.revoked && entry.grants == 0 {
            state.entries.remove(&id);
        }
    }

    /// Registrations held (live, or revoked and still mapped by a peer).
    pub fn held(&self) -> usize {
        self.state().entries.len()
    }

    /// Registrations served by an existing entry so far.
    pub fn cache_hits(&self) -> u64 {
        self.cache_hits.load(Ordering::Relaxed)
    }
}

/// Distinct ids from a counter under the process's random SipHash keys: a random source
/// for registries that need ids that differ, not secrets (the core's tests). Reads
/// nothing.
pub fn counted_ids() -> u64 {
    use std::hash::BuildHasher;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    std::collections::hash_map::RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_payload::TestPayload;
    use ferrylink_memory::Frame;

    type Registry = super::Registry<TestPayload>;

    fn shared(len: usize) -> Frame {
        Frame::Host(ferrylink_ipc::shared_host_buffer(len).unwrap())
    }

    #[test]
    fn registering_the_same_memory_again_is_a_cache_hit() {
        let r = Registry::new(crate::region::counted_ids);
        let buf = ferrylink_ipc::shared_host_buffer(4096).unwrap();
        let (region, offset) = buf.region().map(|(r, o)| (r.clone(), o)).unwrap();
        let a = r.register(Frame::Host(buf), Access::Write);
        let again = Frame::Host(ferrylink_memory::HostBuffer::from_region(region, offset, 4096));
        let b = r.register(again, Access::Write);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(r.cache_hits(), 1);
        // Another access is another registration.
        let region = a.frame.as_host().unwrap().region().map(|(r, o)| (r.clone(), o)).unwrap();
        let c =
            r.register(Frame::Host(ferrylink_memory::HostBuffer::from_region(region.0, region.1, 4096)), Access::Read);
        assert_ne!(a.id, c.id);
        assert!(!r.release_handle(a.id), "a second handle is alive");
        assert!(r.release_handle(a.id), "the last handle revokes");
        assert_eq!(r.held(), 1, "only the read registration is left");
    }

    #[test]
    fn a_grant_needs_this_context_a_live_registration_and_the_secret() {
        let r = Registry::new(crate::region::counted_ids);
        let reg = r.register(shared(100), Access::ReadWrite);
        let key = reg.key;
        assert!(r.grant(&key).is_ok());
        assert!(r.grant(&RemoteKey { secret: key.secret ^ 1, ..key }).unwrap_err().contains("does not match"));
        assert!(r.grant(&RemoteKey { len: 99, ..key }).unwrap_err().contains("does not match"));
        assert!(r.grant(&RemoteKey { registration: 99, ..key }).unwrap_err().contains("does not exist"));
        assert!(Registry::new(crate::region::counted_ids).grant(&key).unwrap_err().contains("another context"));
        // Revoked: no new grant; the entry stays until the granted peer lets go.
        assert!(r.release_handle(reg.id));
        assert!(r.grant(&key).unwrap_err().contains("revoked"));
        assert_eq!(r.held(), 1);
        r.release_grant(reg.id);
        assert_eq!(r.held(), 0, "the memory goes with the last grant");
    }
}
