//! Fuzzes the Windows unwind converter (`kiln_link::windows_unwind`): arbitrary bytes as
//! an `.eh_frame` turned into UNWIND_INFO, and each result decoded back. Any outcome but
//! a panic or a crash is fine.
#![no_main]

use kiln_link::windows_unwind::{decode, from_eh_frame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((entries, _skipped)) = from_eh_frame(data, 0x1000) {
        for entry in entries {
            let _ = decode(&entry.info);
        }
    }
    // The decoder alone, on the raw bytes.
    let _ = decode(data);
});
