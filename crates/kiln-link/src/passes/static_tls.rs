//! The `place-static-tls` pass: the module's block in the static TLS area, if asked.

use crate::graph::{Allocated, LinkGraph};
use crate::{LinkError, LinkOptions};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Initial-exec, local-exec and TLS-descriptor code need the block in static TLS; the
    /// offset it gets is what their relocations need.
    pub(crate) fn place_static_tls(
        &mut self,
        memory: &mut Allocated,
        _: &LinkOptions<'_>,
    ) -> Result<(), LinkError> {
        let l = &self.layout;
        if !self.synthesized.needs_static_tls || l.tls_size == 0 {
            return Ok(());
        }
        let module = memory.tls_module;
        let (size, align) = (self.layout.tls_size, self.layout.tls_align);
        let offset = self
            .linker
            .ctx
            .place_static_tls(module, &self.tls_image, size, align)
            .map_err(|reason| LinkError::StaticTls {
                object: self.first_object(),
                size,
                reason,
            })?;
        self.tp_offset = Some(offset);
        Ok(())
    }
}
