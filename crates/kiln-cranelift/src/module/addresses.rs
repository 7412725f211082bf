//! Where finalized definitions are: their addresses, sizes, and the function an address
//! falls in.
use super::*;

impl KilnModule {
    /// The address of a finalized function (as `JITModule::get_finalized_function`).
    ///
    /// # Panics
    /// If the function is not finalized (not defined, pending, or freed), as
    /// `JITModule`'s does.
    pub fn get_finalized_function(&self, func_id: FuncId) -> *const u8 {
        match &self.functions[func_id] {
            Slot::Finalized(d) => d.address as *const u8,
            Slot::Pending => panic!("function not yet finalized"),
            Slot::Empty => panic!("function must be compiled before it can be finalized"),
        }
    }

    /// The address and size of a finalized data object (as
    /// `JITModule::get_finalized_data`). A thread-local has an address per thread: its
    /// address here is null (its code reaches it with `tls_value`).
    ///
    /// # Panics
    /// If the data object is not finalized, as `JITModule`'s does.
    pub fn get_finalized_data(&self, data_id: DataId) -> (*const u8, usize) {
        match &self.data[data_id] {
            Slot::Finalized(d) => (d.address as *const u8, d.size as usize),
            Slot::Pending => panic!("data object not yet finalized"),
            Slot::Empty => panic!("data object must be compiled before it can be finalized"),
        }
    }

    /// The address `name` resolves to (as `JITModule::get_address`): a finalized
    /// definition's, or the library's resolution of a declared name; null for an
    /// unresolved preemptible name.
    ///
    /// # Panics
    /// If a name that must resolve does not (as `JITModule`'s does).
    pub fn get_address(&self, name: &ModuleRelocTarget) -> *const u8 {
        let lookup = |symbol: &str| self.jit.lookup(self.lib, symbol).ok();
        match name {
            ModuleRelocTarget::User { .. } => {
                let Some((id, _)) = declared_target(name) else {
                    unreachable!("a user name names a declaration")
                };
                let linkage = match id {
                    FuncOrDataId::Func(f) => self.declarations.get_function_decl(f).linkage,
                    FuncOrDataId::Data(d) => self.declarations.get_data_decl(d).linkage,
                };
                if let Slot::Finalized(d) = self.slot(id) {
                    return d.address as *const u8;
                }
                let symbol = self.name_of(id);
                match lookup(&symbol) {
                    Some(address) => address as *const u8,
                    None if linkage == Linkage::Preemptible => std::ptr::null(),
                    None => panic!("can't resolve symbol {symbol}"),
                }
            }
            ModuleRelocTarget::LibCall(libcall) => {
                let symbol = (self.libcall_names)(*libcall);
                match lookup(&symbol) {
                    Some(address) => address as *const u8,
                    None => panic!("can't resolve libcall {symbol}"),
                }
            }
            ModuleRelocTarget::FunctionOffset(f, offset) => match &self.functions[*f] {
                Slot::Finalized(d) => (d.address as *const u8).wrapping_add(*offset as usize),
                _ => panic!("function {f} is not finalized"),
            },
            ModuleRelocTarget::KnownSymbol(known) => {
                panic!("no address for the linker's symbol {known:?}")
            }
        }
    }

    /// The finalized function `address` falls in, and the offset into it: for
    /// backtraces and crash reports of JIT code (its frames carry no symbol table a
    /// debugger reads; with the session's debug support, gdb and perf see them too).
    pub fn function_at(&self, address: *const u8) -> Option<(String, usize)> {
        let address = address as u64;
        self.functions.iter().find_map(|(f, slot)| match slot {
            Slot::Finalized(d) if (d.body..d.body + d.size).contains(&address) => Some((
                self.name_of(FuncOrDataId::Func(f)),
                (address - d.body) as usize,
            )),
            _ => None,
        })
    }
}
