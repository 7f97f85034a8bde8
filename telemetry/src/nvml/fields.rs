//! NVLink traffic on Hopper and newer GPUs: NVML field values with a per-link scope.
//!
//! Those GPUs dropped the NVLink utilisation counters. Their replacement is the field
//! pair `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX` (cumulative KiB of data, protocol
//! overhead excluded), asked once per link with the link number in `scopeId`.
//! `nvml-wrapper` 0.13's `field_values_for` always leaves `scopeId` at 0, so this module
//! calls `nvmlDeviceGetFieldValues` itself, through the library `nvml-wrapper` loaded.
//! It is the crate's only unsafe code, and all of it is that one call.
#![allow(unsafe_code)]

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{field_id, nvmlFieldValue_t};

const SUCCESS: u32 = 0;
const VALUE_UNSIGNED_INT: u32 = 1;
const VALUE_UNSIGNED_LONG: u32 = 2;
const VALUE_UNSIGNED_LONG_LONG: u32 = 3;

/// Cumulative data sent and received on each of `links`, in KiB: `(tx, rx)`, one entry
/// per link in the order given.
///
/// An error that any one field answers fails the whole query, so a row never mixes
/// links that were read with links that were not; `NotSupported` means the driver has
/// no such fields for this GPU (pre-Hopper drivers, or an NVLink-less board).
pub(super) fn nvlink_throughput_kib(
    nvml: &Nvml,
    device: &Device<'_>,
    links: &[u32],
) -> Result<(Vec<u64>, Vec<u64>), NvmlError> {
    if links.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetFieldValues.as_ref())?;
    let mut values: Vec<nvmlFieldValue_t> = links
        .iter()
        .flat_map(|&link| {
            [
                field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                field_id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            ]
            .map(|id| {
                // SAFETY: a plain C struct of integers and a union of numbers; all
                // zeroes is a valid value of each.
                let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
                v.fieldId = id;
                v.scopeId = link;
                v
            })
        })
        .collect();
    let count = i32::try_from(values.len()).map_err(|_| NvmlError::InvalidArg)?;
    // SAFETY: `device.handle()` is a live handle of the `Nvml` it came from (borrowed
    // for this call), and `values` holds exactly `count` initialised entries that NVML
    // fills in place.
    nvml_try(unsafe { sym(device.handle(), count, values.as_mut_ptr()) })?;
    let mut tx = Vec::with_capacity(links.len());
    let mut rx = Vec::with_capacity(links.len());
    for pair in values.chunks_exact(2) {
        tx.push(kib(&pair[0])?);
        rx.push(kib(&pair[1])?);
    }
    Ok((tx, rx))
}

/// The unsigned value of one answered field.
fn kib(v: &nvmlFieldValue_t) -> Result<u64, NvmlError> {
    if v.nvmlReturn != SUCCESS {
        nvml_try(v.nvmlReturn)?;
    }
    // SAFETY: `valueType` says which member of the union NVML wrote.
    unsafe {
        match v.valueType {
            VALUE_UNSIGNED_INT => Ok(u64::from(v.value.uiVal)),
            VALUE_UNSIGNED_LONG => Ok(v.value.ulVal),
            VALUE_UNSIGNED_LONG_LONG => Ok(v.value.ullVal),
            other => Err(NvmlError::UnexpectedVariant(other)),
        }
    }
}
