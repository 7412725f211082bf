//! The code cache's entry points: a function defined from the cache, or compiled and
//! stored there (the format is `crate::code_cache`'s).
use super::*;

impl KilnModule {
    /// Defines function `id` from the code cache ([`KilnBuilder::code_cache`]) if it holds
    /// it under `key` — no compile: its code, relocations and unwind table as stored by
    /// [`KilnModule::define_function_and_cache`], in this process or an earlier one.
    /// `Ok(false)` on a miss (or with no cache, or a damaged entry, which is removed):
    /// compile it then. The key is the caller's name for what the function is made from
    /// (its source, say); the function's name, the target and every code generation flag
    /// are added to it.
    ///
    /// [`KilnBuilder::code_cache`]: crate::KilnBuilder::code_cache
    pub fn define_function_from_cache(&mut self, id: FuncId, key: &[u8]) -> ModuleResult<bool> {
        let Some(cache) = self.code_cache.clone() else {
            return Ok(false);
        };
        let me = FuncOrDataId::Func(id);
        self.start_definition(me)?;
        let name = self.name_of(me);
        let key = crate::code_cache::key(&*self.isa, &name, key);
        let entry = match cache.get(&key) {
            Ok(Some(entry)) => entry,
            Ok(None) => return Ok(false),
            Err(error) => {
                tracing::warn!(%error, function = %name, "code cache not read");
                return Ok(false);
            }
        };
        let cached = match crate::code_cache::read(&entry, &name, self.architecture) {
            Ok(cached) => cached,
            Err(error) => {
                tracing::warn!(%error, function = %name, "a damaged code cache entry, removed");
                let _ = cache.remove(&key);
                return Ok(false);
            }
        };
        let (_, _, align, code) = &cached.sections[0];
        self.add_pending(
            me,
            BuiltSectionKind::Code,
            *align,
            Some(code),
            cached.size.max(code.len() as u64),
            &[],
        );
        let Some(definition) = self.pending.definitions.last() else {
            return Ok(false);
        };
        let (text, function) = (definition.section, definition.symbol);
        let architecture = self.architecture;
        let object = self
            .pending
            .object
            .get_or_insert_with(|| BuiltObject::new(architecture));
        let mut sections = vec![text];
        for (section_name, kind, align, bytes) in &cached.sections[1..] {
            sections.push(object.add_section(section_name, *kind, *align, bytes));
        }
        let mut targets = Vec::new();
        for (at, offset, r_type, target, addend) in cached.relocs {
            let section = sections[at];
            let target = match target {
                crate::code_cache::CachedTarget::Itself => RawTarget::Symbol(function),
                crate::code_cache::CachedTarget::Label(s, value) => {
                    RawTarget::Symbol(crate::code_cache::pcrel_label(object, sections[s], value))
                }
                crate::code_cache::CachedTarget::Name(n) => match self.declarations.get_name(&n) {
                    Some(declared) => {
                        targets.push(declared);
                        RawTarget::Definition(declared)
                    }
                    None => RawTarget::Name(n),
                },
            };
            self.pending.raw.push(RawReloc {
                section,
                offset,
                r_type,
                target,
                addend,
                owner: me,
            });
        }
        targets.sort_unstable();
        targets.dedup();
        targets.retain(|&t| t != me);
        self.record_references(me, &targets);
        Ok(true)
    }

    /// `define_function`, then the compiled function stored in the code cache under `key`
    /// (see [`KilnModule::define_function_from_cache`]). A function that cannot be cached
    /// (it refers to an anonymous declaration, whose name is only this module's) or a
    /// store that fails is defined all the same, with a warning.
    pub fn define_function_and_cache(
        &mut self,
        id: FuncId,
        key: &[u8],
        ctx: &mut cranelift_codegen::Context,
    ) -> ModuleResult<()> {
        let Some(cache) = self.code_cache.clone() else {
            return self.define_function(id, ctx);
        };
        let me = FuncOrDataId::Func(id);
        self.start_definition(me)?;
        ctx.compile(&*self.isa, &mut Default::default())?;
        // Compiled once: what the link takes is what the cache stores.
        let (code, parts) = compiled_parts(&*self.isa, ctx, id)?;
        self.add_compiled(id, code, &parts);
        let name = self.name_of(me);
        let name_of =
            |target: &ModuleRelocTarget| -> Result<(crate::code_cache::Target, i64), String> {
                use crate::code_cache::Target;
                let (id, extra) = match target {
                    ModuleRelocTarget::User { .. } | ModuleRelocTarget::FunctionOffset(..) => {
                        declared_target(target)
                            .ok_or_else(|| format!("{target:?} names no declaration"))?
                    }
                    ModuleRelocTarget::LibCall(libcall) => {
                        return Ok((Target::Name((self.libcall_names)(*libcall)), 0))
                    }
                    ModuleRelocTarget::KnownSymbol(ir::KnownSymbol::ElfGlobalOffsetTable) => {
                        return Ok((Target::Name("_GLOBAL_OFFSET_TABLE_".into()), 0))
                    }
                    ModuleRelocTarget::KnownSymbol(ir::KnownSymbol::CoffTlsIndex) => {
                        return Ok((Target::Name("_tls_index".into()), 0))
                    }
                };
                if id == me {
                    return Ok((Target::Itself, extra));
                }
                let anonymous = match id {
                    FuncOrDataId::Func(f) => self.declarations.get_function_decl(f).name.is_none(),
                    FuncOrDataId::Data(d) => self.declarations.get_data_decl(d).name.is_none(),
                };
                if anonymous {
                    return Err(format!(
                        "it refers to {}, which is anonymous",
                        self.name(id)
                    ));
                }
                Ok((Target::Name(self.name_of(id)), extra))
            };
        let stored = crate::code_cache::function_object(
            &*self.isa,
            self.architecture,
            &crate::code_cache::CompiledFunction {
                name: &name,
                code,
                align: parts.align,
                relocs: &parts.relocs,
                unwind: parts.unwind.as_ref(),
            },
            name_of,
        )
        .and_then(|object| {
            let key = crate::code_cache::key(&*self.isa, &name, key);
            cache.put(&key, &object).map_err(|e| e.to_string())
        });
        if let Err(error) = stored {
            tracing::warn!(%error, function = %name, "not stored in the code cache");
        }
        Ok(())
    }
}
