// A small C++ shim between LLVM 14's MCJIT and Kiln.
//
// Why not LLVM-C's LLVMCreateSimpleMCJITMemoryManager alone: Kiln's memory is dual-mapped
// (the linker writes through a read-write view, the code runs from a read-execute view at
// another address, so sections of many modules can share pages with no page ever writable
// and executable). MCJIT must therefore be told the run-time address of each section
// (RuntimeDyld::mapSectionAddress), so that relocations and symbol addresses use the
// executable view while the bytes are written through the writable one. The C API has no
// way to reach RuntimeDyld; RuntimeDyld::MemoryManager::notifyObjectLoaded(RuntimeDyld&)
// does, so the shim subclasses RTDyldMemoryManager and forwards everything else to Rust.
//
// The shim also provides a forwarding manager over one shared SectionMemoryManager, for
// the benchmark's "engines destroyed, code kept in a shared SectionMemoryManager" case.

#include <llvm-c/ExecutionEngine.h>
#include <llvm/ExecutionEngine/RTDyldMemoryManager.h>
#include <llvm/ExecutionEngine/RuntimeDyld.h>
#include <llvm/ExecutionEngine/SectionMemoryManager.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

extern "C" {
// Returns the writable address of a new section (never null: on failure the Rust side
// returns scratch memory and records the error), and its run-time address in *target.
typedef uint8_t *(*kiln_allocate_fn)(void *ctx, uintptr_t size, unsigned align, unsigned section_id,
                                      int kind, uint64_t *target);
// Returns 0 on success; on failure a malloc'ed message in *error.
typedef int (*kiln_finalize_fn)(void *ctx, char **error);
typedef void (*kiln_destroy_fn)(void *ctx);
// Returns the address of a symbol, or 0 to fall back to the process's symbols.
typedef uint64_t (*kiln_resolve_fn)(void *ctx, const char *name);
}

namespace {

class KilnMemoryManager final : public llvm::RTDyldMemoryManager {
public:
  KilnMemoryManager(void *ctx, kiln_allocate_fn allocate, kiln_finalize_fn finalize, kiln_destroy_fn destroy,
                    kiln_resolve_fn resolve)
      : ctx_(ctx), allocate_(allocate), finalize_(finalize), destroy_(destroy), resolve_(resolve) {}

  ~KilnMemoryManager() override { destroy_(ctx_); }

  uint8_t *allocateCodeSection(uintptr_t size, unsigned align, unsigned id, llvm::StringRef) override {
    return section(size, align, id, 0);
  }

  uint8_t *allocateDataSection(uintptr_t size, unsigned align, unsigned id, llvm::StringRef,
                               bool read_only) override {
    return section(size, align, id, read_only ? 1 : 2);
  }

  void notifyObjectLoaded(llvm::RuntimeDyld &dyld, const llvm::object::ObjectFile &) override {
    for (auto &m : pending_)
      dyld.mapSectionAddress(m.first, m.second);
    pending_.clear();
  }

  bool finalizeMemory(std::string *error) override {
    char *message = nullptr;
    int failed = finalize_(ctx_, &message);
    if (failed && error && message)
      *error = message;
    free(message);
    return failed != 0;
  }

  uint64_t getSymbolAddress(const std::string &name) override {
    if (resolve_) {
      uint64_t a = resolve_(ctx_, name.c_str());
      if (a)
        return a;
    }
    return llvm::RTDyldMemoryManager::getSymbolAddress(name);
  }

  // Unwind information: JIT shaders do not throw; registration is left to the client.
  void registerEHFrames(uint8_t *, uint64_t, size_t) override {}
  void deregisterEHFrames() override {}

private:
  uint8_t *section(uintptr_t size, unsigned align, unsigned id, int kind) {
    uint64_t target = 0;
    uint8_t *working = allocate_(ctx_, size, align, id, kind, &target);
    if (working && target != reinterpret_cast<uint64_t>(working))
      pending_.emplace_back(working, target);
    return working;
  }

  void *ctx_;
  kiln_allocate_fn allocate_;
  kiln_finalize_fn finalize_;
  kiln_destroy_fn destroy_;
  kiln_resolve_fn resolve_;
  std::vector<std::pair<const void *, uint64_t>> pending_;
};

// Forwards to a shared SectionMemoryManager it does not own: destroying the engine keeps
// the code (for the benchmark's comparison).
class SharedSectionForwarder final : public llvm::RTDyldMemoryManager {
public:
  explicit SharedSectionForwarder(llvm::SectionMemoryManager *shared) : shared_(shared) {}
  uint8_t *allocateCodeSection(uintptr_t size, unsigned align, unsigned id, llvm::StringRef name) override {
    return shared_->allocateCodeSection(size, align, id, name);
  }
  uint8_t *allocateDataSection(uintptr_t size, unsigned align, unsigned id, llvm::StringRef name,
                               bool read_only) override {
    return shared_->allocateDataSection(size, align, id, name, read_only);
  }
  bool finalizeMemory(std::string *error) override { return shared_->finalizeMemory(error); }
  void registerEHFrames(uint8_t *, uint64_t, size_t) override {}
  void deregisterEHFrames() override {}

private:
  llvm::SectionMemoryManager *shared_;
};

} // namespace

extern "C" {

LLVMMCJITMemoryManagerRef kiln_mcjit_memory_manager(void *ctx, kiln_allocate_fn allocate, kiln_finalize_fn finalize,
                                                    kiln_destroy_fn destroy, kiln_resolve_fn resolve) {
  return llvm::wrap(
      static_cast<llvm::RTDyldMemoryManager *>(new KilnMemoryManager(ctx, allocate, finalize, destroy, resolve)));
}

void *kiln_shared_section_memory_manager_create(void) { return new llvm::SectionMemoryManager(); }

void kiln_shared_section_memory_manager_destroy(void *shared) {
  delete static_cast<llvm::SectionMemoryManager *>(shared);
}

LLVMMCJITMemoryManagerRef kiln_shared_section_forwarder(void *shared) {
  return llvm::wrap(static_cast<llvm::RTDyldMemoryManager *>(
      new SharedSectionForwarder(static_cast<llvm::SectionMemoryManager *>(shared))));
}
}
