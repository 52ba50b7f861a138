//! [`AnyMemory`]: the backend trait of device memory implemented by matching, with the
//! macros of the one table (`each!`, `pair!`, `triple!`).

use unicomm_core::{DeviceMemory, Error, Result};

use super::{AnyMemory, AnyStream};

impl DeviceMemory for AnyMemory {
    type Stream = AnyStream;
    fn byte_len(&self) -> usize {
        each!(self, AnyMemory, m => m.byte_len())
    }
    fn address(&self) -> usize {
        each!(self, AnyMemory, m => m.address())
    }
    fn outlives_its_work(&self) -> bool {
        each!(self, AnyMemory, m => m.outlives_its_work())
    }
    fn write(&self, offset: usize, src: &[u8], stream: &AnyStream) -> Result<()> {
        pair!(self, AnyMemory, stream, AnyStream, "stream", (m, s) => m.write(offset, src, s))
    }
    fn read(&self, offset: usize, dst: &mut [u8], stream: &AnyStream) -> Result<()> {
        pair!(self, AnyMemory, stream, AnyStream, "stream", (m, s) => m.read(offset, dst, s))
    }
    fn copy_from(
        &self,
        offset: usize,
        src: &AnyMemory,
        src_offset: usize,
        bytes: usize,
        stream: &AnyStream,
    ) -> Result<()> {
        triple!(self, AnyMemory, src, AnyMemory, stream, AnyStream, (d, s, st) => d.copy_from(offset, s, src_offset, bytes, st))
    }
}
