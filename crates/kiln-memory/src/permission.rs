//! The three permissions a segment can end up with.

use std::fmt;

/// The final permission of a segment, as the code that runs sees it.
///
/// Kiln never makes memory writable and executable at once: there is no `RWX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Permission {
    /// Read and execute: code.
    ReadExecute,
    /// Read only: constants, string literals, relocated read-only data.
    Read,
    /// Read and write: mutable data, `.bss`, GOT entries that are written at run time.
    ReadWrite,
}

impl Permission {
    /// All permissions, in the order pools are laid out inside a slab.
    pub const ALL: [Permission; 3] = [
        Permission::ReadExecute,
        Permission::Read,
        Permission::ReadWrite,
    ];

    /// Index of this permission in [`Permission::ALL`].
    pub fn index(self) -> usize {
        match self {
            Permission::ReadExecute => 0,
            Permission::Read => 1,
            Permission::ReadWrite => 2,
        }
    }

    /// Whether code may run from memory with this permission.
    pub fn is_executable(self) -> bool {
        self == Permission::ReadExecute
    }

    /// Whether the running code may write memory with this permission.
    pub fn is_writable(self) -> bool {
        self == Permission::ReadWrite
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Permission::ReadExecute => "r-x",
            Permission::Read => "r--",
            Permission::ReadWrite => "rw-",
        })
    }
}
