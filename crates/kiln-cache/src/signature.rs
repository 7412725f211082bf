//! What an object is the product of, and the key it is cached under.

use std::fmt;

/// A cache key: the BLAKE3 of a [`Signature`]'s canonical text.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey(pub [u8; 32]);

impl CacheKey {
    /// The key as 64 hex digits (file names, store keys).
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({})", self.hex())
    }
}

/// Everything that decides the bytes of a compiled object. Two compilations with equal
/// signatures produce interchangeable objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// BLAKE3 of the preprocessed source (every header it includes, expanded).
    pub source: [u8; 32],
    /// The compiler: its path and what `--version` says.
    pub compiler: String,
    /// The target triple (`cc -dumpmachine`).
    pub target: String,
    /// The host CPU's features, when the flags ask for the host CPU (`-march=native`);
    /// else empty.
    pub cpu: String,
    /// The flags, in order.
    pub flags: Vec<String>,
    /// Environment variables the client declared relevant: (name, value or empty).
    pub environment: Vec<(String, String)>,
    /// The files the preprocessor read, the source first, with the BLAKE3 of their
    /// contents just after it ran (not part of the canonical text: their contents are in
    /// `source`); recorded in a manifest so that a later run can find the object without
    /// preprocessing, and checked again after the compile.
    pub inputs: Vec<(std::path::PathBuf, [u8; 32])>,
    /// Whether an input changed while it was being read (modified at or after the
    /// preprocessor started): such a compile is not cached.
    pub racy: bool,
}

impl Signature {
    /// The canonical text: what the key hashes and the object's note holds. Versioned, so
    /// that a change of format is a miss rather than a wrong hit.
    pub fn canonical(&self) -> String {
        let mut text = String::from("kiln-cache-signature 1\n");
        text.push_str(&format!(
            "source {}\n",
            self.source
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        ));
        text.push_str(&format!("compiler {}\n", self.compiler.replace('\n', " ")));
        text.push_str(&format!("target {}\n", self.target.trim()));
        text.push_str(&format!("cpu {}\n", self.cpu.trim()));
        for flag in &self.flags {
            text.push_str(&format!("flag {}\n", flag.replace('\n', " ")));
        }
        for (name, value) in &self.environment {
            text.push_str(&format!("env {name}={}\n", value.replace('\n', " ")));
        }
        text
    }

    /// The key the object is stored under.
    pub fn key(&self) -> CacheKey {
        CacheKey(*blake3::hash(self.canonical().as_bytes()).as_bytes())
    }
}

impl Signature {
    /// Records each input's hash now, and whether one changed since `started`.
    pub(crate) fn with_inputs(
        mut self,
        files: impl Iterator<Item = std::path::PathBuf>,
        started: std::time::SystemTime,
    ) -> Self {
        for path in files {
            match crate::files::read_regular(
                &path,
                crate::files::Links::Follow,
                crate::MAX_ENTRY_BYTES,
            ) {
                Ok(bytes) => {
                    let modified = std::fs::metadata(&path).and_then(|m| m.modified());
                    self.racy |= modified.map_or(true, |m| m >= started);
                    self.inputs.push((path, *blake3::hash(&bytes).as_bytes()));
                }
                Err(_) => self.racy = true,
            }
        }
        self
    }

    /// Whether every input still has the contents it had when the preprocessor ran.
    pub fn inputs_unchanged(&self) -> bool {
        self.inputs.iter().all(|(path, hash)| {
            crate::files::read_regular(path, crate::files::Links::Follow, crate::MAX_ENTRY_BYTES)
                .is_ok_and(|bytes| blake3::hash(&bytes).as_bytes() == hash)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signature() -> Signature {
        Signature {
            source: [7; 32],
            compiler: "/usr/bin/cc gcc 12.2.0".into(),
            target: "x86_64-linux-gnu".into(),
            cpu: String::new(),
            flags: vec!["-O2".into()],
            environment: vec![("LANG".into(), "C".into())],
            inputs: Vec::new(),
            racy: false,
        }
    }

    #[test]
    fn every_field_changes_the_key() {
        let base = signature();
        let mut variants = Vec::new();
        let mut s = base.clone();
        s.source[0] = 8;
        variants.push(s);
        let mut s = base.clone();
        s.compiler.push('!');
        variants.push(s);
        let mut s = base.clone();
        s.target = "aarch64-linux-gnu".into();
        variants.push(s);
        let mut s = base.clone();
        s.cpu = "avx2".into();
        variants.push(s);
        let mut s = base.clone();
        s.flags.push("-g".into());
        variants.push(s);
        let mut s = base.clone();
        s.environment[0].1 = "en_US".into();
        variants.push(s);
        for v in variants {
            assert_ne!(v.key(), base.key(), "{v:?}");
        }
        assert_eq!(signature().key(), base.key(), "deterministic");
    }
}
