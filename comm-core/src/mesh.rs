//! [`DeviceMesh`]: the world laid out as named dimensions (`dp` x `tp`, ...), with one
//! communicator per dimension for this rank, as PyTorch's `DeviceMesh` gives them.

use crate::backend::Collective;
use crate::{Comm, CommConfig, Error, Result};

/// This rank's communicators along each dimension of a mesh of the world.
///
/// Ranks are laid out row-major, the last dimension fastest (PyTorch's `init_device_mesh`):
/// in a `[("dp", 2), ("tp", 2)]` mesh of 4 ranks the `tp` groups are {0, 1} and {2, 3} and
/// the `dp` groups {0, 2} and {1, 3}. The child along a dimension is ranked by this rank's
/// coordinate in it.
///
/// (Example: the facade's `guide`, "Process groups".)
pub struct DeviceMesh<C: Collective> {
    names: Vec<String>,
    shape: Vec<usize>,
    coords: Vec<usize>,
    comms: Vec<Comm<C>>,
}

impl<C: Collective> DeviceMesh<C> {
    /// Builds the mesh from `world` (collective: every rank calls it with the same
    /// dimensions, whose sizes multiply to the world size): one split per dimension, in
    /// order.
    pub fn new(world: &Comm<C>, dims: &[(&str, usize)]) -> Result<Self> {
        Self::with_config(world, dims, &CommConfig::default())
    }

    /// [`DeviceMesh::new`] with the children's configuration.
    pub fn with_config(
        world: &Comm<C>,
        dims: &[(&str, usize)],
        config: &CommConfig,
    ) -> Result<Self> {
        let shape: Vec<usize> = dims.iter().map(|d| d.1).collect();
        let names: Vec<String> = dims.iter().map(|d| d.0.to_string()).collect();
        if dims.is_empty() || shape.contains(&0) {
            return Err(Error::invalid(
                "dims",
                "a mesh needs dimensions of size >= 1",
            ));
        }
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(Error::invalid(
                    "dims",
                    format!("dimension `{n}` is named twice"),
                ));
            }
        }
        let total = shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
        if total != Some(world.world_size()) {
            return Err(Error::invalid(
                "dims",
                format!(
                    "the sizes {shape:?} multiply to {}, the world has {} ranks",
                    total.map_or_else(|| "an overflow".into(), |t| t.to_string()),
                    world.world_size()
                ),
            ));
        }
        // Row-major coordinates of this rank.
        let mut coords = vec![0; shape.len()];
        let mut rest = world.rank();
        for d in (0..shape.len()).rev() {
            coords[d] = rest % shape[d];
            rest /= shape[d];
        }
        let mut comms = Vec::with_capacity(shape.len());
        for d in 0..shape.len() {
            // The color numbers the other coordinates; the key is the coordinate along d.
            let color = (0..shape.len())
                .filter(|&e| e != d)
                .fold(0usize, |c, e| c * shape[e] + coords[e]);
            let child = world
                .split_with(Some(color as u32), coords[d] as i32, config)?
                .ok_or_else(|| Error::invalid("dims", "a rank with a color got no child"))?;
            comms.push(child);
        }
        Ok(DeviceMesh {
            names,
            shape,
            coords,
            comms,
        })
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.names.iter().position(|n| n == name).ok_or_else(|| {
            Error::invalid(
                "name",
                format!("no dimension `{name}` (the mesh has {:?})", self.names),
            )
        })
    }

    /// This rank's communicator along the dimension `name`.
    pub fn dim(&self, name: &str) -> Result<&Comm<C>> {
        Ok(&self.comms[self.index(name)?])
    }

    /// This rank's coordinate along `name`.
    pub fn coord(&self, name: &str) -> Result<usize> {
        Ok(self.coords[self.index(name)?])
    }

    /// The dimensions' names and sizes, in order.
    pub fn shape(&self) -> impl Iterator<Item = (&str, usize)> {
        self.names
            .iter()
            .map(String::as_str)
            .zip(self.shape.iter().copied())
    }

    /// Finalizes every dimension's communicator (the first error is returned after all were
    /// tried).
    pub fn finalize(self) -> Result<()> {
        let mut first = Ok(());
        for c in self.comms {
            let r = c.finalize();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl<C: Collective> std::fmt::Debug for DeviceMesh<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMesh")
            .field(
                "dims",
                &self.names.iter().zip(&self.shape).collect::<Vec<_>>(),
            )
            .field("coords", &self.coords)
            .finish()
    }
}
