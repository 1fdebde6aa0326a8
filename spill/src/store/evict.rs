//! The placement and eviction policy: a new entry goes to the highest tier it fits;
//! making room in a tier moves its least recently used entries one tier down (device →
//! host → disk, cascading), dropping the copy above only once the copy below is in place.

use std::hash::Hash;

use ferrylink_memory::serialize::{assemble_host, device_frames_to_host, HostMessage};
use ferrylink_memory::{Frame, HostBuffer, Message};

use super::state::{usage_of, Entry, Place, Shared, State};
use crate::{Rejected, SpillError, Tier};

impl Shared {
    /// Evicts host LRU entries to disk until `bytes` more fit in the host budget.
    pub(super) fn make_room_host<K: Eq + Hash + Clone>(
        &self,
        st: &mut State<K>,
        bytes: usize,
    ) -> Result<(), SpillError> {
        if bytes > self.host_budget {
            return Err(self.no_room(Tier::Host, bytes, "larger than the host budget"));
        }
        while st.host_used + bytes > self.host_budget {
            let Some(key) = st.lru[Tier::Host as usize].values().next().cloned() else {
                return Err(self.no_room(Tier::Host, bytes, "nothing left to evict"));
            };
            self.evict_host(st, &key)?;
        }
        Ok(())
    }

    /// Moves a host entry to disk; the host copy is released only once the file is in
    /// place (a large one by the store's thread, see `releaser`).
    pub(super) fn evict_host<K: Eq + Hash + Clone>(&self, st: &mut State<K>, key: &K) -> Result<(), SpillError> {
        let Some(Entry { tick, place: Place::Host { msg, origins } }) = st.detach(key) else {
            return Ok(());
        };
        let slices: Vec<&[u8]> = msg.frames.iter().filter_map(Frame::as_host).map(HostBuffer::as_slice).collect();
        match self.write_file(st, &msg.header, &slices, &origins) {
            Ok((path, file_len)) => {
                let bytes = msg.payload_len();
                drop(slices);
                self.releaser.release(msg);
                st.attach(key.clone(), Place::Disk { path, bytes, file_len }, Some(tick));
                st.stats.host_to_disk += 1;
                st.record_eviction(key);
                Ok(())
            }
            Err(e) => {
                drop(slices);
                st.attach(key.clone(), Place::Host { msg, origins }, Some(tick));
                Err(e)
            }
        }
    }

    /// Evicts device LRU entries with bytes on `ordinal` until `bytes` more fit.
    pub(super) fn make_room_device<K: Eq + Hash + Clone>(
        &self,
        st: &mut State<K>,
        ordinal: usize,
        bytes: usize,
    ) -> Result<(), SpillError> {
        if bytes > self.device_budget {
            return Err(self.no_room(Tier::Device, bytes, "larger than the device budget"));
        }
        while st.device_used(ordinal) + bytes > self.device_budget {
            let victim = st.lru[Tier::Device as usize].values().find(|k| {
                matches!(&st.entries[*k].place, Place::Device { usage, .. } if usage.iter().any(|u| u.0 == ordinal && u.1 > 0))
            });
            let Some(key) = victim.cloned() else {
                return Err(self.no_room(Tier::Device, bytes, "nothing left to evict on this device"));
            };
            self.evict_device(st, &key)?;
        }
        Ok(())
    }

    /// Moves a device entry to host (or disk when it is larger than the host budget).
    /// The device copy is dropped only once the host/disk copy is in place.
    pub(super) fn evict_device<K: Eq + Hash + Clone>(&self, st: &mut State<K>, key: &K) -> Result<(), SpillError> {
        let Some(Entry { tick, place: Place::Device { msg, usage } }) = st.detach(key) else {
            return Ok(());
        };
        let restore = |st: &mut State<K>, msg: Message, usage| {
            st.attach(key.clone(), Place::Device { msg, usage }, Some(tick));
        };
        let weight = msg.payload_len();
        if weight <= self.host_budget {
            if let Err(e) = self.make_room_host(st, weight) {
                restore(st, msg, usage);
                return Err(e);
            }
            let copies = match device_frames_to_host(&msg, self.pool.as_ref()) {
                Ok(c) => c,
                Err(e) => {
                    restore(st, msg, usage);
                    return Err(e.into());
                }
            };
            match assemble_host(msg, copies) {
                Ok(hm) => {
                    let HostMessage { header, frames, origins } = hm;
                    let msg = Message::new(header, frames.into_iter().map(Frame::Host).collect());
                    st.attach(key.clone(), Place::Host { msg, origins }, Some(tick));
                    st.stats.device_to_host += 1;
                    st.record_eviction(key);
                    Ok(())
                }
                Err(f) => {
                    restore(st, f.value, usage);
                    Err(f.error.into())
                }
            }
        } else {
            match self.write_device_message(st, &msg) {
                Ok((path, file_len)) => {
                    drop(msg);
                    st.attach(key.clone(), Place::Disk { path, bytes: weight, file_len }, Some(tick));
                    st.stats.device_to_disk += 1;
                    st.record_eviction(key);
                    Ok(())
                }
                Err(e) => {
                    restore(st, msg, usage);
                    Err(e)
                }
            }
        }
    }

    /// Places a new entry in the highest tier it fits, making room there.
    pub(super) fn place_new<K: Eq + Hash + Clone>(
        &self,
        st: &mut State<K>,
        key: K,
        msg: Message,
    ) -> Result<(), Rejected> {
        let usage = usage_of(&msg);
        if !usage.is_empty() && usage.iter().all(|u| u.1 <= self.device_budget) {
            for &(d, b) in &usage {
                if let Err(error) = self.make_room_device(st, d, b) {
                    return Err(Rejected { error, message: msg });
                }
            }
            st.attach(key, Place::Device { msg, usage }, None);
            return Ok(());
        }
        let weight = msg.payload_len();
        if weight <= self.host_budget {
            if let Err(error) = self.make_room_host(st, weight) {
                return Err(Rejected { error, message: msg });
            }
            let copies = match device_frames_to_host(&msg, self.pool.as_ref()) {
                Ok(c) => c,
                Err(e) => return Err(Rejected { error: e.into(), message: msg }),
            };
            match assemble_host(msg, copies) {
                Ok(hm) => {
                    if hm.has_device_origin() {
                        st.stats.device_to_host += 1;
                    }
                    let HostMessage { header, frames, origins } = hm;
                    let msg = Message::new(header, frames.into_iter().map(Frame::Host).collect());
                    st.attach(key, Place::Host { msg, origins }, None);
                    Ok(())
                }
                Err(f) => Err(Rejected { error: f.error.into(), message: f.value }),
            }
        } else {
            match self.write_device_message(st, &msg) {
                Ok((path, file_len)) => {
                    if !usage.is_empty() {
                        st.stats.device_to_disk += 1;
                    }
                    drop(msg);
                    st.attach(key, Place::Disk { path, bytes: weight, file_len }, None);
                    Ok(())
                }
                Err(error) => Err(Rejected { error, message: msg }),
            }
        }
    }
}
