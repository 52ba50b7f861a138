//! Running the sweep: per rank, buffers of the largest size prepared once per mode
//! (allocated, registered or put in windows), then every workload timed with device events.
mod cells;
mod data;
mod drive;
mod floor;
mod fused;
mod graphed;
mod modes;
mod ranks;
mod sweep;
mod types;
mod vcounts;

pub(crate) use floor::floors;
pub use floor::Floor;
pub use modes::{unsupported, Measure, ModeMemory};
pub use ranks::{devices, DeviceRow};
pub use sweep::sweep;
pub(crate) use vcounts::moe_mean_elems;
