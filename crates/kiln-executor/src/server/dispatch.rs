//! One request served: what each request does in this process.

use super::*;

pub(super) enum Reply {
    Plain(Response),
    WithFd(Response, std::os::fd::OwnedFd),
}

/// `dlsym` in this process (or a library opened here): (address or 0, kind: 0 unknown,
/// 1 function, 2 data).
pub(super) fn lookup(handle: *mut c_void, name: &str) -> (u64, u8) {
    match runtime::dlsym(handle, name) {
        Some(a) => (a, kind_to_wire(runtime::host_symbol_is_function(a))),
        None => (0, 0),
    }
}

/// Maps the pages of freshly initialized data segments into this process's page tables
/// in one call per segment: the controller wrote them through its own view, so they
/// exist but are not mapped here, and each first write would fault once per page (reads
/// of code and constants fault 16 pages at a time, which populating ahead did not beat:
/// Lua --oop within noise, and a 64 MiB code image's finalize went 0.2 -> 7 ms). Best
/// effort (Linux 5.14+; older kernels fault as before).
pub(super) fn populate_target(segments: &[SegmentRange], page: u64) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    for s in segments
        .iter()
        .filter(|s| s.permission == Permission::ReadWrite)
    {
        let start = s.target & !(page - 1);
        let end = (s.target + s.len).next_multiple_of(page);
        // SAFETY: populating changes neither contents nor permissions; the range covers
        // a segment the controller just initialized in one of this connection's
        // reservations (checked by the caller).
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                (end - start) as usize,
                MADV_POPULATE_WRITE,
            )
        };
    }
}

/// Definitions a controller exports, each checked to lie in this connection's code.
pub(super) fn exported(
    state: &State,
    symbols: Vec<kiln_wire::protocol::WireExport>,
) -> Result<Vec<kiln_runtime::shared_object::ExportedSymbol>, String> {
    symbols
        .into_iter()
        .map(|(name, address, size, function)| {
            state.code(address)?;
            Ok(kiln_runtime::shared_object::ExportedSymbol {
                name: name.into(),
                address,
                size,
                function,
            })
        })
        .collect()
}

pub(super) fn handle(state: &mut State, request: Request) -> Result<Reply, String> {
    let ok = Ok(Reply::Plain(Response::Ok));
    match request {
        Request::Batch(requests) => {
            let mut answers = Vec::with_capacity(requests.len());
            for request in requests {
                let name = request.to_string();
                // The others are served by the connection's loop, not here.
                let answer = if request.batchable() {
                    handle(state, request)
                } else {
                    Err(format!("{name} cannot be batched"))
                };
                match answer {
                    Ok(Reply::Plain(response)) => answers.push(response),
                    Ok(Reply::WithFd(..)) => {
                        answers.push(Response::Error(format!("{name}: cannot be batched")));
                        break;
                    }
                    Err(message) => {
                        answers.push(Response::Error(message));
                        break;
                    }
                }
            }
            Ok(Reply::Plain(Response::Batched(answers)))
        }
        Request::Reserve {
            len,
            placement,
            share,
        } => {
            if share && !state.can_pass_fds {
                return Err(
                    "shared memory needs a Unix socket to pass its descriptor: use the copy transport over TCP"
                        .into(),
                );
            }
            let mapper = state.mapper()?;
            if len == 0 || len % mapper.page_size() != 0 || len > 1 << 40 {
                return Err(format!("cannot reserve {len:#x} bytes"));
            }
            let placement = match placement {
                WirePlacement::Anywhere => Placement::Anywhere,
                WirePlacement::HostLibraries => Placement::HostLibraries,
                WirePlacement::Near(start, end) if start <= end => Placement::Near { start, end },
                WirePlacement::Near(start, end) => {
                    return Err(format!(
                        "placement near {start:#x}..{end:#x}: the range is reversed"
                    ))
                }
                WirePlacement::Low2GiB => Placement::Low2GiB,
            };
            let reservation = mapper.reserve(len, &placement).map_err(|e| e.to_string())?;
            let fd = if share {
                match mapper.share(&reservation) {
                    Ok(fd) => Some(fd),
                    Err(e) => {
                        // SAFETY: just reserved, unused.
                        let _ = unsafe { mapper.release(&reservation) };
                        return Err(e.to_string());
                    }
                }
            } else {
                None
            };
            let handle = state.next_handle;
            state.next_handle += 1;
            let target = reservation.target;
            state.reservations.insert(handle, reservation);
            let response = Response::Reserved { target, handle };
            Ok(match fd {
                Some(fd) => Reply::WithFd(response, fd),
                None => Reply::Plain(response),
            })
        }
        Request::Prepare {
            handle,
            start,
            end,
            permission: p,
        } => {
            let r = *state.pages(handle, start, end)?;
            // SAFETY: checked to be whole pages of a reservation of this connection; the
            // controller's allocator owns their use.
            unsafe { state.mapper()?.prepare(&r, start, end, permission(p)) }
                .map_err(|e| e.to_string())?;
            state.unprepared_mut(handle).remove(start, end);
            ok
        }
        Request::Initialize { handle, segments } => {
            let r = *state.reservation(handle)?;
            let mut ranges = Vec::with_capacity(segments.len());
            for (target, len, p) in segments {
                state.checked(handle, target, len)?;
                ranges.push(SegmentRange {
                    target,
                    len,
                    permission: permission(p),
                });
            }
            // SAFETY: the segments lie in this reservation (checked); the controller has
            // finished writing them.
            unsafe { state.mapper()?.initialize(&r, &ranges) }.map_err(|e| e.to_string())?;
            populate_target(&ranges, state.mapper()?.page_size());
            ok
        }
        Request::Deinitialize { handle, start, end } => {
            let r = *state.pages(handle, start, end)?;
            // Queued perf records copy code from these pages: written first.
            kiln_runtime::debug_outputs::flush();
            // Unwind registrations on these pages go first: their data is discarded.
            state.eh_frames.retain(|&a, _| !(start..end).contains(&a));
            state.unprepared_mut(handle).insert(start, end);
            let p = Permission::ReadExecute;
            // SAFETY: whole pages of this connection's reservation that its allocator freed.
            unsafe { state.mapper()?.deinitialize(&r, start, end, p) }
                .map_err(|e| e.to_string())?;
            ok
        }
        Request::Release { handle } => {
            kiln_runtime::debug_outputs::flush();
            let r = state
                .reservations
                .remove(&handle)
                .ok_or_else(|| format!("no reservation with handle {handle}"))?;
            state.eh_frames.retain(|&addr, _| !r.contains(addr, 1));
            state.unprepared.remove(&handle);
            // SAFETY: removed from the table: released once; its code is the controller's
            // to have stopped using.
            unsafe { state.mapper()?.release(&r) }.map_err(|e| e.to_string())?;
            ok
        }
        Request::Write {
            handle,
            address,
            bytes,
        } => {
            let r = state.checked(handle, address, bytes.len() as u64)?;
            let working = r
                .working_address(address)
                .ok_or("address outside reservation")?;
            // SAFETY: the range lies inside the reservation (checked), whose working view
            // is a read-write mapping this executor owns.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), working, bytes.len()) };
            ok
        }
        Request::Read {
            handle,
            address,
            len,
        } => {
            if len > u64::from(kiln_wire::protocol::MAX_WRITE) {
                return Err(format!("read of {len:#x} bytes is too large"));
            }
            let r = state.checked(handle, address, len)?;
            let working = r
                .working_address(address)
                .ok_or("address outside reservation")?;
            let mut out = vec![0u8; len as usize];
            // SAFETY: as for Write, reading.
            unsafe { std::ptr::copy_nonoverlapping(working, out.as_mut_ptr(), len as usize) };
            Ok(Reply::Plain(Response::Bytes(out)))
        }
        Request::Lookup { library, name } => {
            let (address, kind) = lookup(state.library(library)?, &name);
            Ok(Reply::Plain(Response::Symbol { address, kind }))
        }
        Request::LookupMany { library, names } => {
            let handle = state.library(library)?;
            let list = names.iter().map(|name| lookup(handle, name)).collect();
            Ok(Reply::Plain(Response::Symbols(list)))
        }
        Request::LoadLibrary { path } => {
            if let Some(&id) = state.library_paths.get(&path) {
                return Ok(Reply::Plain(Response::Value(id)));
            }
            // A library new to the process may need the program's names when it loads,
            // or look them up later: deferred exports are published before it where it
            // could see them.
            if let (_, Err(error)) = runtime::note_library_loading(&path) {
                tracing::warn!(%error, library = %path, "the program's exports could not be published");
            }
            let handle = runtime::dlopen(&path)?;
            let id = state.libraries.len() as u64 + 1;
            state.libraries.insert(id, Library(handle));
            state.library_paths.insert(path, id);
            Ok(Reply::Plain(Response::Value(id)))
        }
        Request::StoreCodePointer { slot, target } => {
            if slot % 8 != 0 {
                return Err(format!("slot {slot:#x} is not 8-byte aligned"));
            }
            state.accessible(slot, 8)?;
            state.code(target)?;
            // SAFETY: an aligned slot on prepared pages of memory this executor reserved
            // (checked): a stub's slot, which only atomic stores and the stub's loads
            // touch; the target lies in reserved code (checked).
            unsafe { kiln_runtime::lazy_entry::store_code_pointer(slot, target) };
            let epoch = kiln_runtime::code_guards::advance();
            state.slot_stores.insert(slot, epoch);
            Ok(Reply::Plain(Response::Value(epoch)))
        }
        Request::OldestCodeGuard => Ok(Reply::Plain(Response::Value(
            kiln_runtime::code_guards::oldest(),
        ))),
        Request::RegisterUnwindInfo { .. }
        | Request::RegisterFunctionTable { .. }
        | Request::DeregisterUnwindInfo { .. } => {
            Err("Windows unwind data is for Windows executors: this one registers .eh_frame".into())
        }
        Request::RegisterEhFrame { address } => {
            if state.eh_frames.contains_key(&address) {
                return Err(format!("eh_frame at {address:#x} is registered already"));
            }
            state.check_eh_frame(address)?;
            if let Some(reg) = EhFrameRegistration::register(address) {
                state.eh_frames.insert(address, reg);
            }
            ok
        }
        Request::DeregisterEhFrame { address } => {
            state.eh_frames.remove(&address);
            ok
        }
        Request::ReserveTlsModule => Ok(Reply::Plain(Response::Value(
            kiln_runtime::thread_locals::tls_reserve_module(),
        ))),
        Request::InstallTls {
            module_id,
            size,
            align,
            image,
        } => {
            if size > 1 << 30
                || !align.is_power_of_two()
                || align > 1 << 16
                || image.len() as u64 > size
            {
                return Err(format!(
                    "invalid TLS template: size {size}, align {align}, image {}",
                    image.len()
                ));
            }
            if !kiln_runtime::thread_locals::tls_install(kiln_runtime::thread_locals::TlsImage {
                module_id,
                image,
                size,
                align,
            }) {
                return Err(format!("TLS module {module_id:#x} was not reserved here"));
            }
            ok
        }
        Request::RemoveTls { module_id } => {
            kiln_runtime::thread_locals::tls_remove(module_id);
            ok
        }
        Request::PlaceStaticTls {
            module_id,
            size,
            align,
            image,
        } => {
            if size == 0 || !align.is_power_of_two() || align > 1 << 16 || image.len() as u64 > size
            {
                return Err(format!(
                    "invalid TLS block: size {size}, align {align}, image {}",
                    image.len()
                ));
            }
            let offset = kiln_runtime::thread_locals::tls_place_static(
                &kiln_runtime::thread_locals::TlsImage {
                    module_id,
                    image,
                    size,
                    align,
                },
            )?;
            Ok(Reply::Plain(Response::Value(offset as u64)))
        }
        Request::ExportSymbols { symbols } => {
            let list = exported(state, symbols)?;
            let handle = runtime::export_symbols(&list)?;
            let id = state.next_export;
            state.next_export += 1;
            state.exports.insert(id, handle);
            Ok(Reply::Plain(Response::Value(id)))
        }
        Request::DeferExports { handle, symbols } => {
            if handle & kiln_wire::protocol::CONTROLLER_HANDLE == 0 {
                return Err(format!(
                    "defer exports: handle {handle:#x} is not a controller's (bit 63 clear)"
                ));
            }
            if state.exports.contains_key(&handle) {
                return Err(format!("defer exports: handle {handle:#x} is in use"));
            }
            let list = exported(state, symbols)?;
            let exports = runtime::export_symbols_on_demand(list)?;
            state.exports.insert(handle, exports);
            ok
        }
        Request::EnableDebugOutputs(outputs) => {
            kiln_runtime::debug_outputs::enable(&outputs)?;
            if outputs.gdb && state.reservations.is_empty() {
                // Code a debugger can put breakpoints in: private target views (a
                // debugger cannot write to a shared read-only page). Reservations made
                // before stay shared (hardware breakpoints only there).
                if let Ok(mapper) = std::mem::replace(&mut state.mapper, Err(String::new())) {
                    drop(mapper);
                }
                state.mapper = DualMappedMapper::new()
                    .map(|m| m.with_private_target(true))
                    .map_err(|e| e.to_string());
            }
            ok
        }
        Request::RegisterDebug(module) => {
            for f in &module.functions {
                state.accessible(f.address, f.size)?;
            }
            // SAFETY: every function lies in memory this executor reserved (checked).
            let handle = unsafe { kiln_runtime::debug_outputs::register(module) }?;
            Ok(Reply::Plain(Response::Value(handle)))
        }
        Request::UnregisterDebug { handle } => {
            kiln_runtime::debug_outputs::unregister(handle);
            ok
        }
        Request::UnexportSymbols { handle } => match state.exports.remove(&handle) {
            Some(h) => {
                runtime::unexport_symbols(h);
                ok
            }
            None => Err(format!("no exports with handle {handle}")),
        },
        Request::RunMain { .. }
        | Request::Call { .. }
        | Request::RunInitializers { .. }
        | Request::RunFinalizers { .. } => Err("runs code: served by run_code".into()),
        Request::ResolveStub { .. } => {
            Err("ResolveStub goes from the executor to the controller".into())
        }
        Request::Shutdown => ok,
        Request::Input { bytes } => {
            give_input(bytes);
            ok
        }
        Request::AdoptStdio => Err("adopt stdio: handled by the connection".into()),
        Request::SetEnvironment {
            variables,
            directory,
        } => {
            kiln_runtime::runtime::adopt_environment(&variables, &directory)?;
            ok
        }
        Request::GuardBranchTargets { address, len } => {
            let page = state.mapper()?.page_size();
            if address % page != 0 || len % page != 0 || len == 0 {
                return Err(format!(
                    "guard branch targets: {address:#x}+{len:#x} is not whole pages"
                ));
            }
            state.accessible(address, len)?;
            // SAFETY: whole prepared pages of a reservation of ours; the session asks for
            // its modules' code only (replacing its permission by read + execute + guard,
            // never adding write).
            unsafe { kiln_runtime::runtime::guard_branch_targets(address, len)? };
            ok
        }
    }
}
