//! Helpers for examples and tests: tiny x86-64 objects without a compiler.

/// An x86-64 ELF object defining `long name(void) { return value; }`.
pub fn constant_function(name: &str, value: i32) -> Vec<u8> {
    let mut code = vec![0xb8]; // mov $value, %eax (sign-extended below)
    code.extend_from_slice(&value.to_le_bytes());
    code.extend_from_slice(&[0x48, 0x63, 0xc0, 0xc3]); // movslq %eax, %rax; ret
    function_object(name, &code)
}

/// An x86-64 ELF object defining `name` as the global function `code`.
pub fn function_object(name: &str, code: &[u8]) -> Vec<u8> {
    use object::write::{Object, StandardSection, Symbol, SymbolSection};
    use object::{SymbolFlags, SymbolKind, SymbolScope};
    let mut obj = Object::new(
        object::BinaryFormat::Elf,
        object::Architecture::X86_64,
        object::Endianness::Little,
    );
    let text = obj.section_id(StandardSection::Text);
    let offset = obj.append_section_data(text, code, 16);
    obj.add_symbol(Symbol {
        name: name.as_bytes().to_vec(),
        value: offset,
        size: code.len() as u64,
        kind: SymbolKind::Text,
        scope: SymbolScope::Dynamic,
        weak: false,
        section: SymbolSection::Section(text),
        flags: SymbolFlags::None,
    });
    // Writing an object of one section and one symbol cannot fail.
    obj.write().unwrap_or_default()
}
