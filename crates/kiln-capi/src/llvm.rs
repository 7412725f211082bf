//! Kiln under LLVM-C's MCJIT: an `LLVMMCJITMemoryManagerRef` backed by Kiln's shared
//! slabs, so that a C program disposes each engine and keeps the code (feature `llvm`).

use crate::error::{guard, kiln_error, kiln_status};
use std::ffi::c_char;

/// LLVM-C's opaque memory manager (`LLVMMCJITMemoryManagerRef` is a pointer to it).
pub struct LLVMOpaqueMCJITMemoryManager {
    _private: [u8; 0],
}

/// Kiln's memory for MCJIT engines: one shared slab manager for every engine's sections.
pub struct kiln_mcjit {
    jit: kiln_llvm::KilnMcjit,
}

/// One engine's code, in Kiln's memory: it stays callable after the engine, its module
/// and its context are disposed, until [`kiln_module_code_free`].
pub struct kiln_module_code {
    code: kiln_llvm::ModuleCode,
    error: Option<std::ffi::CString>,
}

/// Creates Kiln's memory for MCJIT engines (and initializes LLVM's native target).
///
/// # Safety
/// `mcjit` a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_mcjit_create(
    mcjit: *mut *mut kiln_mcjit,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        if mcjit.is_null() {
            return Err(kiln_error::invalid("mcjit is NULL"));
        }
        kiln_llvm::initialize_llvm();
        let manager = kiln_memory::SlabMemoryManager::new()
            .map_err(|e| kiln_error::new(kiln_status::KILN_ERR_MEMORY, e.to_string()))?;
        let boxed = Box::new(kiln_mcjit {
            jit: kiln_llvm::KilnMcjit::new(manager),
        });
        // SAFETY: a valid out-pointer (checked).
        unsafe { *mcjit = Box::into_raw(boxed) };
        Ok(())
    })
}

/// A memory manager for one engine: set it as `options.MCJMM` of
/// `LLVMCreateMCJITCompilerForModule`. The engine owns the manager (disposing the engine
/// destroys it; LLVM destroys it too if the engine cannot be made); `*code` receives the
/// code's handle, which owns the sections the engine puts in Kiln's memory. Returns NULL
/// (and `*code` NULL) on a NULL argument.
///
/// # Safety
/// `mcjit` live; `code` a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_mcjit_create_memory_manager(
    mcjit: *const kiln_mcjit,
    code: *mut *mut kiln_module_code,
) -> *mut LLVMOpaqueMCJITMemoryManager {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        let (Some(mcjit), false) = (unsafe { mcjit.as_ref() }, code.is_null()) else {
            return std::ptr::null_mut();
        };
        let (manager, module_code) = mcjit.jit.memory_manager();
        let handle = Box::new(kiln_module_code {
            code: module_code,
            error: None,
        });
        // SAFETY: a valid out-pointer (checked).
        unsafe { *code = Box::into_raw(handle) };
        manager.cast()
    }))
    .unwrap_or(std::ptr::null_mut())
}

/// Why an allocation for this code failed (the engine then fails to finalize), or NULL.
/// Valid until the next call with `code` or its free.
///
/// # Safety
/// `code` a live handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_code_error(code: *mut kiln_module_code) -> *const c_char {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        let Some(code) = (unsafe { code.as_mut() }) else {
            return std::ptr::null();
        };
        code.error = code
            .code
            .error()
            .map(|e| std::ffi::CString::new(e.replace('\0', " ")).unwrap_or_default());
        code.error.as_ref().map_or(std::ptr::null(), |e| e.as_ptr())
    }))
    .unwrap_or(std::ptr::null())
}

/// Frees a module's code (NULL is ignored): its functions must not run any more.
///
/// # Safety
/// `code` is NULL or a handle from [`kiln_mcjit_create_memory_manager`], freed once.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_code_free(code: *mut kiln_module_code) {
    if !code.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the caller's contract: made by Box::into_raw, freed once.
            drop(unsafe { Box::from_raw(code) });
        }));
    }
}

/// Kiln's memory figures for the MCJIT code: live allocations and resident bytes
/// (`UINT64_MAX` if unknown) into the out-pointers (either may be NULL).
///
/// # Safety
/// `mcjit` live.
#[no_mangle]
pub unsafe extern "C" fn kiln_mcjit_memory(
    mcjit: *const kiln_mcjit,
    live_allocations: *mut u64,
    bytes_resident: *mut u64,
) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        let Some(mcjit) = (unsafe { mcjit.as_ref() }) else {
            return;
        };
        use kiln_memory::MemoryManager;
        let stats = mcjit.jit.manager().stats();
        if !live_allocations.is_null() {
            // SAFETY: a valid out-pointer (checked).
            unsafe { *live_allocations = stats.live_allocations };
        }
        if !bytes_resident.is_null() {
            // SAFETY: as above.
            unsafe { *bytes_resident = stats.bytes_resident.unwrap_or(u64::MAX) };
        }
    }));
}

/// Disposes Kiln's MCJIT memory (NULL is ignored). Code handles still held keep their
/// memory until freed.
///
/// # Safety
/// `mcjit` is NULL or from [`kiln_mcjit_create`], disposed once.
#[no_mangle]
pub unsafe extern "C" fn kiln_mcjit_dispose(mcjit: *mut kiln_mcjit) {
    if !mcjit.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the caller's contract: made by Box::into_raw, disposed once.
            drop(unsafe { Box::from_raw(mcjit) });
        }));
    }
}
