//! The swap store: a real file ([`file`]) and a device model that gives
//! each transfer its time ([`device`]).

pub mod device;
pub mod file;

pub use device::{Device, DeviceModel, DevicePreset, DeviceStats, LatencyRange};
pub use file::{SwapError, SwapFile, SwapSlot};
