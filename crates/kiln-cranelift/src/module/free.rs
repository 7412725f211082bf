//! Freeing one function or data object, everything, and what keeps a free from breaking
//! a caller: the references between definitions, the batches, the trap of freed stubs.
use super::*;

impl KilnModule {
    /// Frees one finalized function: its name can be defined again, and once every
    /// definition of its `finalize_definitions` is freed, their memory is returned and
    /// filled with trap instructions (a stale call traps, never runs other code).
    ///
    /// Refused while another live definition (finalized or pending) refers to it.
    pub fn free_function(&mut self, func_id: FuncId) -> ModuleResult<()> {
        self.free(FuncOrDataId::Func(func_id))
    }

    /// [`KilnModule::free_function`] for a data object.
    pub fn free_data(&mut self, data_id: DataId) -> ModuleResult<()> {
        self.free(FuncOrDataId::Data(data_id))
    }

    pub(super) fn free(&mut self, id: FuncOrDataId) -> ModuleResult<()> {
        let name = self.name_of(id);
        let batch = match self.slot(id) {
            Slot::Finalized(d) => d.batch,
            Slot::Pending => {
                return Err(backend(KilnModuleError::NotFinalized {
                    name,
                    state: "defined, not yet finalized",
                }))
            }
            Slot::Empty => {
                return Err(backend(KilnModuleError::NotFinalized {
                    name,
                    state: "not defined",
                }))
            }
        };
        if self.referrers.get(&id).is_some_and(|&n| n > 0) {
            // Who they are (a scan, on this error only).
            let mut users: Vec<String> = self
                .refers_to
                .iter()
                .filter(|(_, targets)| targets.contains(&id))
                .map(|(&u, _)| self.name_of(u))
                .collect();
            users.sort();
            return Err(backend(KilnModuleError::InUse { name, users }));
        }
        if self.hot_swap && matches!(id, FuncOrDataId::Func(_)) {
            // Its stub leads to a trap from now on; the body is retired (freed once no
            // code guard taken before now is held).
            let trap = self.trap()?;
            self.jit
                .retire_function(self.lib, &name, trap)
                .map_err(|source| {
                    backend(KilnModuleError::Session {
                        what: format!("retiring {name}"),
                        source,
                    })
                })?;
        }
        *self.slot_mut(id) = Slot::Empty;
        self.forget_references(id);
        self.release(batch);
        Ok(())
    }

    /// One definition of `batch` is gone: the last one takes the batch's module with it
    /// (its memory freed and poisoned once no other handle holds it).
    pub(super) fn release(&mut self, batch: u32) {
        if let Some(Some(b)) = self.batches.get_mut(batch as usize) {
            b.live -= 1;
            if b.live == 0 {
                self.batches[batch as usize] = None;
            }
        }
    }

    /// The address of a function that traps, linked on first use: where a freed
    /// function's stub leads.
    pub(super) fn trap(&mut self) -> ModuleResult<u64> {
        if let Some((_, address)) = &self.trap {
            return Ok(*address);
        }
        // `ud2`, `udf #0`, and RISC-V's all-zero word, an illegal instruction.
        let code: &[u8] = match self.architecture {
            Architecture::X86_64 => &[0x0f, 0x0b],
            Architecture::Aarch64 | Architecture::Riscv64 => &[0, 0, 0, 0],
        };
        let mut object = BuiltObject::new(self.architecture);
        let text = object.add_section(".text.trap", BuiltSectionKind::Code, 16, code);
        object.add_symbol(
            "kiln_cranelift_freed_function",
            Some((text, 0, code.len() as u64)),
            SymbolBinding::Global,
            BuiltSymbolKind::Function,
        );
        let session = |source| {
            backend(KilnModuleError::Session {
                what: "linking the trap of freed functions".into(),
                source,
            })
        };
        let input =
            ObjectInput::built("freed functions' trap", object).map_err(|e| session(e.into()))?;
        let module = self.jit.link_private(self.lib, input).map_err(session)?;
        let address = module
            .symbol("kiln_cranelift_freed_function")
            .ok_or_else(|| ModuleError::Backend(anyhow::anyhow!("the trap has no address")))?;
        self.trap = Some((module, address));
        Ok(address)
    }

    /// Records that `id`'s code refers to `targets`.
    pub(super) fn record_references(&mut self, id: FuncOrDataId, targets: &[FuncOrDataId]) {
        if targets.is_empty() {
            return;
        }
        for &t in targets {
            *self.referrers.entry(t).or_default() += 1;
        }
        self.refers_to.insert(id, targets.iter().copied().collect());
    }

    pub(super) fn forget_references(&mut self, id: FuncOrDataId) {
        if let Some(targets) = self.refers_to.remove(&id) {
            for t in targets.iter() {
                if let Some(count) = self.referrers.get_mut(t) {
                    *count -= 1;
                    if *count == 0 {
                        self.referrers.remove(t);
                    }
                }
            }
        }
    }

    /// Frees everything the module linked (as `JITModule::free_memory`).
    ///
    /// # Safety
    /// No function of the module may be running, nor be called afterwards: their memory
    /// is unmapped or reused (a call into it traps at best).
    pub unsafe fn free_memory(mut self) {
        self.freed = true;
        self.batches.clear();
    }
}
