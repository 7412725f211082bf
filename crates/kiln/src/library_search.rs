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

/// The system directories searched after the `-L` ones.
pub fn default_search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = [
        "/usr/local/lib/x86_64-linux-gnu",
        "/usr/local/lib",
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib",
        "/usr/lib",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    // gcc's own directory (libstdc++.so, libgcc.a live there), newest version first.
    if let Ok(entries) = std::fs::read_dir("/usr/lib/gcc/x86_64-linux-gnu") {
        let mut versions: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        versions.sort();
        dirs.extend(versions.into_iter().rev());
    }
    dirs
}

/// Finds `-l name` in `dirs` (shared before static in each directory, as `ld` does by
/// default), expanding ld scripts into the files they name.
pub fn find_library(name: &str, dirs: &[PathBuf]) -> Result<Vec<LibraryFile>, Error> {
    for dir in dirs {
        let shared = dir.join(format!("lib{name}.so"));
        if shared.is_file() {
            return expand(&shared);
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

/// A `.so` path: an ELF shared object, or an ld script naming others.
fn expand(path: &Path) -> Result<Vec<LibraryFile>, Error> {
    let head = read_head(path)?;
    if head.starts_with(b"\x7fELF") {
        return Ok(vec![LibraryFile::Shared(path.to_path_buf())]);
    }
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_ld_script(path, &text)
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
pub fn parse_ld_script(path: &Path, text: &str) -> Result<Vec<LibraryFile>, Error> {
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
                    files.extend(find_library(lib, &default_search_dirs())?);
                } else if file.ends_with(".a") {
                    files.push(LibraryFile::Archive(PathBuf::from(file)));
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
        let files = parse_ld_script(Path::new("libm.so"), text).unwrap();
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
        let files = parse_ld_script(Path::new("libc.so"), text).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(
            files[1],
            LibraryFile::Archive("/usr/lib/x86_64-linux-gnu/libc_nonshared.a".into())
        );
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse_ld_script(Path::new("x.so"), "hello world").is_err());
    }
}
