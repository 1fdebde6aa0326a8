//! One-sided transfers over real UCX: registrations and the keys they pack.

use super::*;

/// Contexts with RMA on, over loopback TCP.
fn rma_config() -> UcxConfig {
    tcp_config().rma(true)
}

/// Without the RMA feature nothing is registered; a registration reports its buffer's
/// range and packs a key that passes the checks peers apply; empty and (on a UCX without
/// CUDA) device registrations are refused with their buffer given back.
#[test]
fn registrations_need_rma_a_range_and_a_memory_ucx_can_reach() {
    let Some(plain) = context_or_skip() else { return };
    assert!(!plain.supports_rma(), "RMA is opt-in");
    let rejected = plain.register(vec![1u8; 64]).expect_err("no RMA");
    assert!(matches!(rejected.error, UcxError::RmaDisabled), "{:?}", rejected.error);
    assert_eq!(rejected.buf, vec![1u8; 64]);

    let context = UcxContext::new(&rma_config()).expect("RMA context");
    assert!(context.supports_rma());
    let bytes = pattern(4096, 1);
    let address = bytes.as_ptr() as u64;
    let registration = context.register(bytes).expect("register");
    let range = (registration.address(), registration.len(), registration.memory_type());
    assert_eq!(range, (address, 4096, MemoryType::Host));
    let key = registration.region_key().expect("pack");
    assert_eq!((key.address, key.length), (address, 4096));
    assert_eq!(crate::region_key::check_packed_rkey(&key.rkey), Ok(MemoryType::Host), "a key peers accept");

    let rejected = context.register(Vec::new()).expect_err("empty");
    assert!(matches!(rejected.error, UcxError::EmptyRegistration), "{:?}", rejected.error);
    let mut host = vec![0u8; 64];
    let at = host.as_mut_ptr().cast();
    // SAFETY: valid host memory that outlives the calls; without CUDA support they are
    // refused before UCX is called, so nothing ever accesses it as device memory.
    let fake_device = || unsafe { RawBuf::from_raw_parts(at, 64, MemoryType::Cuda) };
    if !context.supports_cuda_memory() {
        let rejected = context.register(fake_device()).expect_err("no CUDA");
        assert!(matches!(rejected.error, UcxError::CudaUnsupported), "{:?}", rejected.error);
    }
    assert_eq!(registration.into_buf(), pattern(4096, 1), "given back");
}
