//! The swap store: a real file ([`file`]) and a device model that gives
//! each transfer its time ([`device`]).

pub mod device;
pub(crate) mod file;

pub(crate) use device::Device;
pub use device::{DeviceModel, DevicePreset, DeviceStats, LatencyRange};
pub(crate) use file::SwapFile;
pub use file::{SwapError, SwapSlot};
