//! Listeners: C callbacks told of every module loaded and freed.

use crate::error::{guard, kiln_error, kiln_status};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

/// What a symbol names.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kiln_symbol_kind {
    /// Code.
    KILN_SYMBOL_FUNCTION = 0,
    /// Data.
    KILN_SYMBOL_DATA = 1,
    /// Anything else with an address.
    KILN_SYMBOL_OTHER = 2,
}

/// A section placed in memory.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_section_info {
    /// The object it came from: an index into `kiln_module_info.objects`.
    pub object: usize,
    /// Its name (`.text.f`).
    pub name: *const c_char,
    /// Its target address.
    pub address: u64,
    /// Its size.
    pub size: u64,
}

/// A symbol with its address.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_symbol_info {
    /// Its name (as the object spells it).
    pub name: *const c_char,
    /// Its target address.
    pub address: u64,
    /// Its size (0 if the object does not say).
    pub size: u64,
    /// What it names.
    pub kind: kiln_symbol_kind,
    /// 1 for a global symbol, 0 for one local to its object.
    pub global: c_int,
}

/// An object linked into the module (archive members included).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_object_info {
    /// Its name (`lib.a(member.o)` for a member).
    pub name: *const c_char,
    /// Its bytes.
    pub bytes: *const c_void,
    /// Their size.
    pub size: usize,
}

/// A module loaded or about to be freed. Everything it points to is valid during the
/// callback only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_module_info {
    /// The module's id, unique within its session (the same at load and free).
    pub id: u64,
    /// Its name (its first object's).
    pub name: *const c_char,
    /// Sections placed in memory.
    pub sections: *const kiln_section_info,
    /// Their number.
    pub section_count: usize,
    /// Symbols with addresses.
    pub symbols: *const kiln_symbol_info,
    /// Their number.
    pub symbol_count: usize,
    /// Objects linked.
    pub objects: *const kiln_object_info,
    /// Their number.
    pub object_count: usize,
}

/// A listener: told of each module's load (after it is linked and published, before its
/// initializers run) and free (before its memory is released), from the thread that links
/// or frees, with no session lock held. A callback returning non-zero is reported (a
/// `tracing` warning) and the link or free goes on: listeners cannot make a link fail.
/// A listener is told of the free of every module whose load it was told of, even after
/// its registration is removed.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_listener_callbacks {
    /// Passed to every callback.
    pub context: *mut c_void,
    /// A module was loaded (NULL: not told).
    pub loaded: Option<
        unsafe extern "C" fn(context: *mut c_void, module: *const kiln_module_info) -> c_int,
    >,
    /// A module is about to be freed (NULL: not told).
    pub freed: Option<
        unsafe extern "C" fn(context: *mut c_void, module: *const kiln_module_info) -> c_int,
    >,
    /// Called once when no module can call the listener any more (NULL: nothing to free).
    pub destroy: Option<unsafe extern "C" fn(context: *mut c_void)>,
}

/// A listener's registration: remove it with [`kiln_listener_remove`].
pub struct kiln_listener {
    _registration: kiln::plugin::PluginRegistration,
}

struct CListener(kiln_listener_callbacks);

// SAFETY: the API's contract: listener callbacks may be called from any thread.
unsafe impl Send for CListener {}
// SAFETY: as above.
unsafe impl Sync for CListener {}

impl Drop for CListener {
    fn drop(&mut self) {
        if let Some(destroy) = self.0.destroy {
            // SAFETY: the listener's destructor, called once.
            unsafe { destroy(self.0.context) };
        }
    }
}

fn c(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

impl CListener {
    fn call(
        &self,
        module: &kiln::plugin::LoadedModule,
        callback: Option<unsafe extern "C" fn(*mut c_void, *const kiln_module_info) -> c_int>,
    ) -> Result<(), kiln::plugin::PluginError> {
        let Some(callback) = callback else {
            return Ok(());
        };
        let name = c(&module.name);
        let section_names: Vec<CString> = module.sections.iter().map(|s| c(&s.name)).collect();
        let sections: Vec<kiln_section_info> = module
            .sections
            .iter()
            .zip(&section_names)
            .map(|(s, n)| kiln_section_info {
                object: s.object,
                name: n.as_ptr(),
                address: s.address,
                size: s.size,
            })
            .collect();
        let symbol_names: Vec<CString> = module.symbols.iter().map(|s| c(&s.name)).collect();
        let symbols: Vec<kiln_symbol_info> = module
            .symbols
            .iter()
            .zip(&symbol_names)
            .map(|(s, n)| kiln_symbol_info {
                name: n.as_ptr(),
                address: s.address,
                size: s.size,
                kind: match s.kind {
                    kiln::plugin::SymbolKind::Function => kiln_symbol_kind::KILN_SYMBOL_FUNCTION,
                    kiln::plugin::SymbolKind::Data => kiln_symbol_kind::KILN_SYMBOL_DATA,
                    kiln::plugin::SymbolKind::Other => kiln_symbol_kind::KILN_SYMBOL_OTHER,
                },
                global: c_int::from(s.global),
            })
            .collect();
        let object_names: Vec<CString> = module.objects.iter().map(|o| c(&o.name)).collect();
        let objects: Vec<kiln_object_info> = module
            .objects
            .iter()
            .zip(&object_names)
            .map(|(o, n)| kiln_object_info {
                name: n.as_ptr(),
                bytes: o.bytes().as_ptr().cast(),
                size: o.bytes().len(),
            })
            .collect();
        let info = kiln_module_info {
            id: module.id,
            name: name.as_ptr(),
            sections: sections.as_ptr(),
            section_count: sections.len(),
            symbols: symbols.as_ptr(),
            symbol_count: symbols.len(),
            objects: objects.as_ptr(),
            object_count: objects.len(),
        };
        // SAFETY: the listener's callback; `info` and what it points to live until it
        // returns.
        match unsafe { callback(self.0.context, &info) } {
            0 => Ok(()),
            rc => Err(format!("the listener returned {rc}").into()),
        }
    }
}

impl kiln::plugin::Plugin for CListener {
    fn name(&self) -> &str {
        "C listener"
    }
    fn module_loaded(
        &self,
        module: &kiln::plugin::LoadedModule,
    ) -> Result<(), kiln::plugin::PluginError> {
        self.call(module, self.0.loaded)
    }
    fn module_freed(
        &self,
        module: &kiln::plugin::LoadedModule,
    ) -> Result<(), kiln::plugin::PluginError> {
        self.call(module, self.0.freed)
    }
}

/// Registers a listener; `*registration` receives its registration (remove it with
/// [`kiln_listener_remove`]). Several listeners may be registered; they are told in the
/// order they were registered.
///
/// # Safety
/// `session` live; `callbacks` valid (copied); `registration` a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_add_listener(
    session: *const crate::session::kiln_session,
    callbacks: *const kiln_listener_callbacks,
    registration: *mut *mut kiln_listener,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = crate::session::session(session)?;
        // SAFETY: the caller's contract.
        let callbacks = unsafe { callbacks.as_ref() }
            .ok_or_else(|| kiln_error::invalid("callbacks is NULL"))?;
        if registration.is_null() {
            return Err(kiln_error::invalid("registration is NULL"));
        }
        let listener = Arc::new(CListener(*callbacks));
        let handle = Box::new(kiln_listener {
            _registration: s.jit.add_plugin(listener),
        });
        // SAFETY: a valid out-pointer (checked).
        unsafe { *registration = Box::into_raw(handle) };
        Ok(())
    })
}

/// Removes a listener's registration (NULL is ignored): no more loads are announced to
/// it; frees of modules it was told of still are; its `destroy` is called after the last.
///
/// # Safety
/// `registration` is NULL or from [`kiln_add_listener`], removed once, and its session
/// not yet disposed... or disposed (then this only frees the registration).
#[no_mangle]
pub unsafe extern "C" fn kiln_listener_remove(registration: *mut kiln_listener) {
    if !registration.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the caller's contract: made by Box::into_raw, removed once.
            drop(unsafe { Box::from_raw(registration) });
        }));
    }
}
