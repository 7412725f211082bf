//! Finding `-l NAME` the way a static linker does: `libNAME.so` (possibly a GNU ld
//! script, as Debian's libc.so and libm.so are) or `libNAME.a`, in the `-L` directories and
//! then the system's.

use crate::Error;
use std::path::{Path, PathBuf};

/// What `-l NAME` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibraryFile {
    /// A static archive.
    Archive(PathBuf),
    /// A shared object to open with `dlopen`.
    Shared(PathBuf),
}

/// The system directories searched after the `-L` ones, for this process's architecture.
pub fn default_search_dirs() -> Vec<PathBuf> {
    search_dirs_for(kiln_link::Architecture::host())
}

/// The system directories searched after the `-L` ones for code of `architecture`:
/// Debian's multiarch directories of that architecture (`/usr/lib/aarch64-linux-gnu`, as
/// `dpkg --add-architecture arm64` fills it), its cross compiler's C library
/// (`/usr/aarch64-linux-gnu/lib`, from libc6-dev-arm64-cross), then the plain ones, then
/// its gcc's (`/usr/lib/gcc/TRIPLE/VERSION`, or a cross compiler's
/// `/usr/lib/gcc-cross/TRIPLE/VERSION`).
pub fn search_dirs_for(architecture: kiln_link::Architecture) -> Vec<PathBuf> {
    let multiarch = match architecture {
        kiln_link::Architecture::X86_64 => "x86_64-linux-gnu",
        kiln_link::Architecture::Aarch64 => "aarch64-linux-gnu",
        kiln_link::Architecture::Riscv64 => "riscv64-linux-gnu",
    };
    let mut dirs: Vec<PathBuf> = vec![
        format!("/usr/local/lib/{multiarch}").into(),
        "/usr/local/lib".into(),
        format!("/lib/{multiarch}").into(),
        format!("/usr/lib/{multiarch}").into(),
        format!("/usr/{multiarch}/lib").into(),
        "/lib".into(),
        "/usr/lib".into(),
    ];
    // gcc's own directory (libstdc++.so, libgcc.a live there), newest version first; for
    // another architecture, its cross compiler's (g++-aarch64-linux-gnu's, say).
    for gcc in ["/usr/lib/gcc", "/usr/lib/gcc-cross"] {
        if let Ok(entries) = std::fs::read_dir(format!("{gcc}/{multiarch}")) {
            let mut versions: Vec<PathBuf> =
                entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            versions.sort();
            dirs.extend(versions.into_iter().rev());
        }
    }
    dirs
}

/// Finds `-l name` in `dirs` (shared before static in each directory, as `ld` does by
/// default), expanding ld scripts into the files they name. A `-lNAME` inside a script is
/// searched in the same `dirs`; a script that includes itself, directly or through
/// others, is an error naming the cycle.
pub fn find_library(name: &str, dirs: &[PathBuf]) -> Result<Vec<LibraryFile>, Error> {
    find_in(name, dirs, &mut Vec::new())
}

/// Scripts nested deeper than this are refused (a cycle is caught before).
const MAX_SCRIPT_DEPTH: usize = 16;

fn find_in(
    name: &str,
    dirs: &[PathBuf],
    open: &mut Vec<PathBuf>,
) -> Result<Vec<LibraryFile>, Error> {
    // `-l:FILE`: that file name exactly, as ld takes it.
    if let Some(file) = name.strip_prefix(':') {
        for dir in dirs {
            let path = dir.join(file);
            if path.is_file() {
                return if file.ends_with(".a") {
                    Ok(vec![LibraryFile::Archive(path)])
                } else {
                    expand(&path, dirs, open)
                };
            }
        }
    }
    for dir in dirs.iter().filter(|_| !name.starts_with(':')) {
        let shared = dir.join(format!("lib{name}.so"));
        if shared.is_file() {
            return expand(&shared, dirs, open);
        }
        let archive = dir.join(format!("lib{name}.a"));
        if archive.is_file() {
            return Ok(vec![LibraryFile::Archive(archive)]);
        }
    }
    Err(Error::LibraryNotFound {
        name: name.to_string(),
        searched: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// A `.so` path: an ELF shared object, or an ld script naming others. `open` holds the
/// scripts being expanded, outermost first.
fn expand(
    path: &Path,
    dirs: &[PathBuf],
    open: &mut Vec<PathBuf>,
) -> Result<Vec<LibraryFile>, Error> {
    let head = read_head(path)?;
    if head.starts_with(b"\x7fELF") {
        return Ok(vec![LibraryFile::Shared(path.to_path_buf())]);
    }
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if let Some(first) = open.iter().position(|p| *p == canonical) {
        let cycle: Vec<String> = open[first..]
            .iter()
            .chain([&canonical])
            .map(|p| p.display().to_string())
            .collect();
        return Err(Error::LinkerScript {
            path: path.to_path_buf(),
            what: format!("scripts include each other: {}", cycle.join(" -> ")),
        });
    }
    if open.len() >= MAX_SCRIPT_DEPTH {
        return Err(Error::LinkerScript {
            path: path.to_path_buf(),
            what: format!("scripts nested more than {MAX_SCRIPT_DEPTH} deep"),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    open.push(canonical);
    let result = parse_script(path, &text, dirs, open);
    open.pop();
    result
}

fn read_head(path: &Path) -> Result<Vec<u8>, Error> {
    use std::io::Read;
    let mut head = vec![0u8; 4];
    let mut f = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let n = f.read(&mut head).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    head.truncate(n);
    Ok(head)
}

/// Parses the `GROUP`/`INPUT` commands of a GNU ld script (comments, `OUTPUT_FORMAT`,
/// `AS_NEEDED` understood), e.g. Debian's
/// `GROUP ( /lib/x86_64-linux-gnu/libm.so.6  AS_NEEDED ( /lib/x86_64-linux-gnu/libmvec.so.1 ) )`.
/// `-lNAME` inside it is searched in `dirs`.
pub fn parse_ld_script(
    path: &Path,
    text: &str,
    dirs: &[PathBuf],
) -> Result<Vec<LibraryFile>, Error> {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    parse_script(path, text, dirs, &mut vec![canonical])
}

fn parse_script(
    path: &Path,
    text: &str,
    dirs: &[PathBuf],
    open: &mut Vec<PathBuf>,
) -> Result<Vec<LibraryFile>, Error> {
    // Strip /* */ comments.
    let mut clean = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        clean.push_str(&rest[..start]);
        match rest[start..].find("*/") {
            Some(end) => rest = &rest[start + end + 2..],
            None => {
                rest = "";
            }
        }
    }
    clean.push_str(rest);
    let spaced = clean.replace('(', " ( ").replace(')', " ) ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let mut files = Vec::new();
    let mut i = 0;
    let mut depth = 0;
    let mut in_group = false;
    while i < tokens.len() {
        let t = tokens[i];
        match t {
            "GROUP" | "INPUT" if depth == 0 => in_group = true,
            "OUTPUT_FORMAT" | "OUTPUT_ARCH" | "SEARCH_DIR" | "TARGET" if depth == 0 => {
                // Skip its parenthesized argument.
                let mut d = 0;
                i += 1;
                while i < tokens.len() {
                    match tokens[i] {
                        "(" => d += 1,
                        ")" => {
                            d -= 1;
                            if d == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            "(" => depth += 1,
            ")" => {
                depth -= 1;
                if depth == 0 {
                    in_group = false;
                }
            }
            "AS_NEEDED" => {}
            file if in_group && depth > 0 => {
                let file = file.trim_end_matches(',');
                if let Some(lib) = file.strip_prefix("-l") {
                    files.extend(find_in(lib, dirs, open)?);
                } else if file.ends_with(".a") {
                    files.push(LibraryFile::Archive(PathBuf::from(file)));
                } else if Path::new(file).is_file() {
                    // A shared object, or another script.
                    files.extend(expand(Path::new(file), dirs, open)?);
                } else {
                    files.push(LibraryFile::Shared(PathBuf::from(file)));
                }
            }
            other if depth == 0 => {
                return Err(Error::LinkerScript {
                    path: path.to_path_buf(),
                    what: format!("unknown command '{other}'"),
                })
            }
            _ => {}
        }
        i += 1;
    }
    if files.is_empty() {
        return Err(Error::LinkerScript {
            path: path.to_path_buf(),
            what: "no GROUP or INPUT files".into(),
        });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_libm_script() {
        let text = "/* GNU ld script\n*/\nOUTPUT_FORMAT(elf64-x86-64)\nGROUP ( /lib/x86_64-linux-gnu/libm.so.6  AS_NEEDED ( /lib/x86_64-linux-gnu/libmvec.so.1 ) )\n";
        let files = parse_ld_script(Path::new("libm.so"), text, &[]).unwrap();
        assert_eq!(
            files,
            vec![
                LibraryFile::Shared("/lib/x86_64-linux-gnu/libm.so.6".into()),
                LibraryFile::Shared("/lib/x86_64-linux-gnu/libmvec.so.1".into())
            ]
        );
    }

    #[test]
    fn debian_libc_script() {
        let text = "OUTPUT_FORMAT(elf64-x86-64)\nGROUP ( /lib/x86_64-linux-gnu/libc.so.6 /usr/lib/x86_64-linux-gnu/libc_nonshared.a  AS_NEEDED ( /lib64/ld-linux-x86-64.so.2 ) )\n";
        let files = parse_ld_script(Path::new("libc.so"), text, &[]).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(
            files[1],
            LibraryFile::Archive("/usr/lib/x86_64-linux-gnu/libc_nonshared.a".into())
        );
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_ld_script(Path::new("x.so"), "hello world", &[]).is_err());
    }

    #[test]
    fn scripts_that_include_each_other_are_an_error_not_a_stack_overflow() {
        let dir = std::env::temp_dir().join(format!("kiln-ldscript-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libself.so"), "INPUT ( -lself )\n").unwrap();
        std::fs::write(dir.join("libping.so"), "GROUP ( -lpong )\n").unwrap();
        std::fs::write(dir.join("libpong.so"), "GROUP ( -lping )\n").unwrap();
        let dirs = [dir.clone()];
        for name in ["self", "ping"] {
            match find_library(name, &dirs) {
                Err(Error::LinkerScript { what, .. }) => {
                    assert!(what.contains("include each other"), "{what}")
                }
                other => panic!("-l{name}: expected a cycle error, got {other:?}"),
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn minus_l_inside_a_script_searches_the_minus_capital_l_directories() {
        let dir = std::env::temp_dir().join(format!("kiln-ldscript-l-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libouter.so"), "INPUT ( -linner )\n").unwrap();
        std::fs::write(dir.join("libinner.a"), "!<arch>\n").unwrap();
        let files = find_library("outer", std::slice::from_ref(&dir)).unwrap();
        assert_eq!(files, vec![LibraryFile::Archive(dir.join("libinner.a"))]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
