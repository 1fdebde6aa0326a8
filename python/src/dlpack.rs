//! DLPack (<https://dmlc.github.io/dlpack/latest/>): the C structs, a capsule that lends
//! a received device frame to a consumer (`torch.from_dlpack(frame)`), and reading the
//! capsule a producer (`tensor.__dlpack__()`) hands us.
//!
//! Only the legacy, unversioned `DLManagedTensor` is produced (every consumer takes it,
//! and the spec lets a producer answer a `max_version` request with it); both forms are
//! read.

use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};

/// `kDLCPU`.
pub(crate) const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
pub(crate) const DEVICE_CUDA: i32 = 2;
/// `kDLCUDAHost` (pinned host memory).
pub(crate) const DEVICE_CUDA_HOST: i32 = 3;
/// `kDLCUDAManaged`.
pub(crate) const DEVICE_CUDA_MANAGED: i32 = 13;

const LEGACY_NAME: &CStr = c"dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct DlDevice {
    pub device_type: i32,
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct DlDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
pub(crate) struct DlTensor {
    pub data: *mut c_void,
    pub device: DlDevice,
    pub ndim: i32,
    pub dtype: DlDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// `DLManagedTensor` (legacy).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned`.
#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

/// What a lent capsule keeps alive: the tensor description, its shape, and the object
/// that owns the memory (a `DeviceFrame`). `repr(C)` with `managed` first: the capsule's
/// pointer is the `DLManagedTensor` a consumer reads (without it Rust placed another field
/// first, and torch read the data pointer's low bits as the device type: found on the
/// H200, `BufferError: Unsupported device_type: 268435456`).
#[repr(C)]
struct Lent {
    managed: DlManagedTensor,
    shape: [i64; 1],
    _owner: Py<PyAny>,
}

// The capsule's pointer is both the `Lent` and its `DLManagedTensor`.
const _: () = assert!(std::mem::offset_of!(Lent, managed) == 0);

/// The deleter of a lent tensor: frees the description and lets go of the owner. A
/// consumer may call it on any thread, with or without the GIL: dropping the `Py` there
/// defers the reference count to pyo3, which never blocks.
unsafe extern "C" fn delete_lent(managed: *mut DlManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` belongs to a `Lent` boxed by `lend`, whose `manager_ctx` points at
    // that box; DLPack calls the deleter once.
    unsafe { drop(Box::from_raw((*managed).manager_ctx.cast::<Lent>())) };
}

/// The capsule's destructor: a capsule nobody consumed (still named `dltensor`) frees
/// what it lends; a consumed one (renamed `used_dltensor`) belongs to its consumer.
unsafe extern "C" fn destroy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: called by CPython with the GIL held on a live capsule.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr()).cast::<DlManagedTensor>();
            delete_lent(managed);
        }
    }
}

/// A `dltensor` capsule lending `len` bytes at `ptr` on CUDA device `device` as a 1-D
/// uint8 tensor, keeping `owner` alive until the consumer's tensor goes.
pub(crate) fn lend(
    py: Python<'_>,
    ptr: u64,
    len: usize,
    device: usize,
    owner: Py<PyAny>,
) -> PyResult<Bound<'_, PyAny>> {
    let lent = Box::new(Lent {
        managed: DlManagedTensor {
            dl_tensor: DlTensor {
                data: ptr as *mut c_void,
                device: DlDevice { device_type: DEVICE_CUDA, device_id: device as i32 },
                ndim: 1,
                dtype: DlDataType { code: 1, bits: 8, lanes: 1 },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_lent),
        },
        shape: [len as i64],
        _owner: owner,
    });
    let raw = Box::into_raw(lent);
    // SAFETY: `raw` is live; the pointer names its `managed` field (at offset 0).
    let managed = unsafe { std::ptr::addr_of_mut!((*raw).managed) };
    // SAFETY: `raw` is a fresh, live box; the pointers set here point into it and stay
    // valid until `delete_lent` frees it.
    unsafe {
        (*raw).managed.dl_tensor.shape = (*raw).shape.as_mut_ptr();
        (*raw).managed.manager_ctx = raw.cast();
    }
    // SAFETY: the name is a static C string; the destructor frees `raw` only while the
    // capsule still holds it (it checks the name).
    let capsule = unsafe { ffi::PyCapsule_New(managed.cast(), LEGACY_NAME.as_ptr(), Some(destroy_capsule)) };
    if capsule.is_null() {
        // SAFETY: no capsule took `raw`: it is ours to free.
        unsafe { delete_lent(managed) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `PyCapsule_New` returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

/// What a producer's capsule describes, enough to send it: one contiguous run of bytes.
pub(crate) struct Described {
    /// Address of the first byte (`data + byte_offset`).
    pub ptr: u64,
    /// Bytes (elements × element size).
    pub len: usize,
    pub device: DlDevice,
}

/// Reads the tensor a `__dlpack__()` capsule describes, without consuming it (the capsule,
/// kept alive by the caller, keeps the memory alive and frees it when it goes). A tensor
/// whose elements are not one compact row-major run fails with the reason.
pub(crate) fn describe(capsule: &Bound<'_, PyAny>) -> Result<Described, String> {
    let raw = capsule.as_ptr();
    // SAFETY: `raw` is a live object (borrowed through `capsule`); `PyCapsule_IsValid` accepts
    // any object and sets no error, and the pointers it vouches for live as long as the
    // unconsumed capsule.
    let tensor: &DlTensor = unsafe {
        if ffi::PyCapsule_IsValid(raw, LEGACY_NAME.as_ptr()) == 1 {
            &(*ffi::PyCapsule_GetPointer(raw, LEGACY_NAME.as_ptr()).cast::<DlManagedTensor>()).dl_tensor
        } else if ffi::PyCapsule_IsValid(raw, VERSIONED_NAME.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(raw, VERSIONED_NAME.as_ptr()).cast::<DlManagedTensorVersioned>();
            if (*managed).version.major != 1 {
                return Err(format!("DLPack version {} is not supported", (*managed).version.major));
            }
            &(*managed).dl_tensor
        } else {
            return Err("__dlpack__() did not return a DLPack capsule".into());
        }
    };
    let ndim = usize::try_from(tensor.ndim).map_err(|_| "a negative ndim".to_string())?;
    let shape: &[i64] = if ndim == 0 || tensor.shape.is_null() {
        &[]
    } else {
        // SAFETY: DLPack promises `shape` holds `ndim` entries while the capsule lives.
        unsafe { std::slice::from_raw_parts(tensor.shape, ndim) }
    };
    let strides: Option<&[i64]> = if ndim == 0 || tensor.strides.is_null() {
        None
    } else {
        // SAFETY: as for `shape`.
        Some(unsafe { std::slice::from_raw_parts(tensor.strides, ndim) })
    };
    if !is_row_major(shape, strides) {
        return Err(format!(
            "the tensor is not contiguous (shape {shape:?}, strides {:?}): make it contiguous first",
            strides.unwrap_or_default()
        ));
    }
    let elements = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?));
    let bits = u64::from(tensor.dtype.bits) * u64::from(tensor.dtype.lanes);
    let len = elements
        .and_then(|n| n.checked_mul(bits.div_ceil(8)))
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| format!("a tensor of shape {shape:?} is too large"))?;
    Ok(Described { ptr: (tensor.data as u64).wrapping_add(tensor.byte_offset), len, device: tensor.device })
}

/// Whether `strides` (in elements; `None`: compact) lay `shape` out as one compact
/// row-major run. Dimensions of size 1 may have any stride; an empty tensor is compact.
pub(crate) fn is_row_major(shape: &[i64], strides: Option<&[i64]>) -> bool {
    let Some(strides) = strides else { return true };
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1i64;
    for (&dim, &stride) in shape.iter().zip(strides).rev() {
        if dim != 1 && stride != expected {
            return false;
        }
        expected = expected.saturating_mul(dim);
    }
    true
}
