//! The `fixup-tls-image` pass: relocations inside the thread-local image.

use crate::graph::{Allocated, LinkGraph};
use crate::{LinkError, LinkOptions};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Relocations of the TLS image come first: a block placed in static TLS is copied
    /// into every thread as it is now.
    pub(crate) fn fixup_tls_image(
        &mut self,
        memory: &mut Allocated,
        _: &LinkOptions<'_>,
    ) -> Result<(), LinkError> {
        self.apply_edges(memory, true)
    }
}
