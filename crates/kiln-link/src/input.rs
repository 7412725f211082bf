//! Link inputs: relocatable objects and static archives, as byte buffers.

use crate::built_object::BuiltObject;
use crate::object_file::ObjectFile;
use crate::{Architecture, LinkError};
use object::read::archive::ArchiveFile;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// The bytes of an object, shared: a buffer, a memory-mapped file, a compiler's output —
/// whatever the caller lends, never copied by the linker.
#[derive(Clone)]
pub struct ObjectBytes(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl std::ops::Deref for ObjectBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl std::fmt::Debug for ObjectBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectBytes({} bytes)", self.len())
    }
}

/// An archive member's bytes: a range of the archive's, shared.
struct MemberBytes {
    archive: ObjectBytes,
    range: std::ops::Range<usize>,
}

impl AsRef<[u8]> for MemberBytes {
    fn as_ref(&self) -> &[u8] {
        &self.archive[self.range.clone()]
    }
}

/// A relocatable object: a name for messages and its bytes (and, once
/// [`ObjectInput::check`]ed, its parse, which the link uses instead of parsing again).
#[derive(Clone)]
pub struct ObjectInput {
    /// Name used in messages (a path, or `archive.a(member.o)`).
    pub name: String,
    /// The ELF bytes.
    pub data: ObjectBytes,
    /// The parse [`ObjectInput::check`] made, shared by clones.
    checked: Option<Arc<Checked>>,
    /// An object described in memory ([`ObjectInput::built`]): its view, shared by clones.
    built: Option<Arc<Built>>,
}

/// What a parse borrows from: the object's name and bytes, and the architecture it was
/// checked for.
struct CheckedSource {
    name: String,
    data: ObjectBytes,
    architecture: Architecture,
}

self_cell::self_cell!(
    /// An object's parse, kept beside the bytes it borrows from.
    struct Checked {
        owner: CheckedSource,
        #[covariant]
        dependent: ObjectFile,
    }
);

/// What a built object's view borrows from: its name and the object.
struct BuiltSource {
    name: String,
    object: BuiltObject,
}

self_cell::self_cell!(
    /// A built object's view, kept beside the object it borrows from.
    struct Built {
        owner: BuiltSource,
        #[covariant]
        dependent: ObjectFile,
    }
);

impl std::fmt::Debug for ObjectInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectInput")
            .field("name", &self.name)
            .field("data", &self.data)
            .field("checked", &self.checked.is_some())
            .field("built", &self.built.is_some())
            .finish()
    }
}

impl ObjectInput {
    /// An object from bytes (a `Vec<u8>` is moved, an `Arc<[u8]>` shared).
    pub fn new(name: impl Into<String>, data: impl Into<Arc<[u8]>>) -> Self {
        let data: Arc<[u8]> = data.into();
        ObjectInput {
            name: name.into(),
            data: ObjectBytes(Arc::new(data)),
            checked: None,
            built: None,
        }
    }

    /// An object described in memory (see [`BuiltObject`]): linked as a parsed object
    /// is, with no ELF file made. Its [`ObjectInput::bytes`] are empty. A built object
    /// whose tables do not hold together (a symbol in a section it does not have, a
    /// relocation of a symbol it does not have) is refused here, as a damaged file is.
    pub fn built(name: impl Into<String>, mut object: BuiltObject) -> Result<Self, LinkError> {
        object.seal();
        let name = name.into();
        let source = BuiltSource {
            name: name.clone(),
            object,
        };
        let built = Built::try_new(source, |s| s.object.view(&s.name))?;
        Ok(ObjectInput {
            name,
            data: ObjectBytes(Arc::new(Arc::<[u8]>::from(&[][..]))),
            checked: None,
            built: Some(Arc::new(built)),
        })
    }

    /// An object from bytes the caller shares (e.g. a `memmap2::Mmap` in an `Arc`).
    pub fn shared(name: impl Into<String>, data: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        ObjectInput {
            name: name.into(),
            data: ObjectBytes(data),
            checked: None,
            built: None,
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// Checks that the bytes are an ELF relocatable object for `architecture` — every
    /// table they have, as the link reads them — and keeps that parse for the link, which
    /// then does not parse the object again (a session checks an object when it is
    /// added, so that a bad one cannot fail a link of good ones).
    ///
    /// ```
    /// # use kiln_link::{Architecture, ObjectInput};
    /// let mut bad = ObjectInput::new("bad.o", b"\x7fELF, but cut short".to_vec());
    /// assert!(bad.check(Architecture::X86_64).is_err());
    /// ```
    pub fn check(&mut self, architecture: Architecture) -> Result<(), LinkError> {
        if self.checked(architecture).is_some() {
            return Ok(());
        }
        if let Some(error) = self.built_mismatch(architecture) {
            return Err(error);
        }
        let source = CheckedSource {
            name: self.name.clone(),
            data: self.data.clone(),
            architecture,
        };
        let checked = Checked::try_new(source, |source| {
            ObjectFile::parse(source.name.as_str(), &source.data, source.architecture)
        })?;
        self.checked = Some(Arc::new(checked));
        Ok(())
    }

    /// For an object built in memory ([`ObjectInput::built`]): the same object as an ELF
    /// file ([`BuiltObject::to_elf`]), under the same name. What listeners (a debugger)
    /// are shown of it: they read ELF. `None` for an object given as bytes.
    pub fn as_elf(&self) -> Option<ObjectInput> {
        let built = self.built.as_ref()?;
        Some(ObjectInput::new(
            self.name.clone(),
            built.borrow_owner().object.to_elf(),
        ))
    }

    /// For an object built in memory for another architecture than `architecture`: the
    /// error that says so.
    pub(crate) fn built_mismatch(&self, architecture: Architecture) -> Option<LinkError> {
        let found = self.built.as_ref()?.borrow_owner().object.architecture();
        (found != architecture).then(|| LinkError::WrongArchitecture {
            object: self.name.clone(),
            found: format!("an object built in memory for {found}"),
            expected: architecture,
        })
    }

    /// The parse [`ObjectInput::check`] kept, if it is of these very bytes and name for
    /// `architecture` (the fields are public: a changed input is parsed again).
    pub(crate) fn checked(&self, architecture: Architecture) -> Option<&ObjectFile<'_>> {
        if let Some(built) = &self.built {
            return (built.borrow_owner().object.architecture() == architecture)
                .then(|| built.borrow_dependent());
        }
        let checked = self.checked.as_deref()?;
        let source = checked.borrow_owner();
        let same_bytes = std::ptr::eq(source.data.as_ptr(), self.data.as_ptr())
            && source.data.len() == self.data.len();
        (same_bytes && source.architecture == architecture && source.name == self.name)
            .then(|| checked.borrow_dependent())
    }
}

/// A static archive with its symbol index: a member is loaded only when it defines a
/// symbol the link needs, as a static linker does.
#[derive(Debug, Clone)]
pub struct ArchiveInput {
    /// Name used in messages.
    pub name: String,
    data: ObjectBytes,
    /// The symbol table and the members, read when first needed (shared by clones).
    table: Arc<std::sync::OnceLock<Result<ArchiveTable, String>>>,
}

/// An archive's symbol table and members.
#[derive(Debug)]
struct ArchiveTable {
    /// Symbol → offsets of the members' headers that define it.
    index: FxHashMap<Box<[u8]>, Vec<u64>>,
    /// Member header offset → (member name, data range).
    members: FxHashMap<u64, (String, usize, usize)>,
}

impl ArchiveInput {
    /// Parses an archive (GNU or BSD symbol table; an archive without one is indexed by
    /// scanning its members' symbol tables).
    pub fn parse(name: impl Into<String>, data: impl Into<Arc<[u8]>>) -> Result<Self, LinkError> {
        let data: Arc<[u8]> = data.into();
        Self::parse_shared(name, Arc::new(data))
    }

    /// [`ArchiveInput::parse`] of bytes the caller shares (a memory-mapped archive), never
    /// copied: members linked share them too.
    pub fn parse_shared(
        name: impl Into<String>,
        data: Arc<dyn AsRef<[u8]> + Send + Sync>,
    ) -> Result<Self, LinkError> {
        let archive = Self::deferred(name, data);
        archive.table()?;
        Ok(archive)
    }

    /// An archive whose symbol table and members are read when a link first needs them
    /// (a damaged archive is then that link's error): for a session that may need none
    /// of them (a module mapped from a cached image).
    pub fn deferred(name: impl Into<String>, data: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        ArchiveInput {
            name: name.into(),
            data: ObjectBytes(data),
            table: Arc::new(std::sync::OnceLock::new()),
        }
    }

    /// The symbol table and members, read on first use.
    fn table(&self) -> Result<&ArchiveTable, LinkError> {
        self.table
            .get_or_init(|| read_table(&self.data))
            .as_ref()
            .map_err(|what| LinkError::Archive {
                archive: self.name.clone(),
                what: what.clone(),
            })
    }

    /// Header offsets of the members that define `symbol`.
    pub(crate) fn definers(&self, symbol: &[u8]) -> Result<&[u64], LinkError> {
        Ok(self
            .table()?
            .index
            .get(symbol)
            .map_or(&[], |v| v.as_slice()))
    }

    /// The member at header offset `offset`, as an object input.
    pub(crate) fn member(&self, offset: u64) -> Result<(String, &[u8]), LinkError> {
        let (name, start, end) =
            self.table()?
                .members
                .get(&offset)
                .ok_or_else(|| LinkError::Archive {
                    archive: self.name.clone(),
                    what: format!(
                        "symbol table points at offset {offset:#x}, which is not a member"
                    ),
                })?;
        Ok((format!("{}({})", self.name, name), &self.data[*start..*end]))
    }

    /// The member at header offset `offset` as an object input sharing the archive's
    /// bytes.
    pub(crate) fn member_input(&self, offset: u64) -> Result<ObjectInput, LinkError> {
        let (name, _) = self.member(offset)?;
        let (_, start, end) = self.table()?.members[&offset];
        Ok(ObjectInput::shared(
            name,
            Arc::new(MemberBytes {
                archive: self.data.clone(),
                range: start..end,
            }),
        ))
    }

    /// Number of members (0 for an archive that cannot be read).
    pub fn member_count(&self) -> usize {
        self.table().map_or(0, |t| t.members.len())
    }
}

/// Reads an archive's symbol table and members (the index of a GNU or BSD symbol table;
/// an archive without one is indexed by scanning its members' symbol tables).
fn read_table(data: &ObjectBytes) -> Result<ArchiveTable, String> {
    let data: &[u8] = data;
    let archive = ArchiveFile::parse(data).map_err(|e| e.to_string())?;
    if archive.is_thin() {
        return Err("thin archives are not supported".into());
    }
    let mut members: FxHashMap<u64, (String, usize, usize)> = FxHashMap::default();
    let mut add_member =
        |offset: u64, member: &object::read::archive::ArchiveMember<'_>| -> Result<(), String> {
            let (start, len) = member.file_range();
            let member_name = String::from_utf8_lossy(member.name()).into_owned();
            let end = start.saturating_add(len);
            if end > data.len() as u64 {
                return Err(format!("member {member_name} extends past the end"));
            }
            members.insert(offset, (member_name, start as usize, end as usize));
            Ok(())
        };
    let mut index: FxHashMap<Box<[u8]>, Vec<u64>> = FxHashMap::default();
    match archive.symbols().map_err(|e| e.to_string())? {
        Some(symbols) => {
            let mut seen = rustc_hash::FxHashSet::default();
            for symbol in symbols {
                let symbol = symbol.map_err(|e| e.to_string())?;
                let offset = symbol.offset();
                if seen.insert(offset.0) {
                    let member = archive
                        .member(offset)
                        .map_err(|e| format!("symbol table entry: {e}"))?;
                    add_member(offset.0, &member)?;
                }
                index
                    .entry(symbol.name().into())
                    .or_default()
                    .push(offset.0);
            }
        }
        None => {
            for member in archive.members() {
                let member = member.map_err(|e| e.to_string())?;
                // The member's header lies inside `data`; its distance from the start
                // is the member's offset, the key the symbol table would use.
                let offset = member.header().map_or(0, |h| {
                    (h as *const _ as usize).wrapping_sub(data.as_ptr() as usize)
                }) as u64;
                add_member(offset, &member)?;
            }
            for (&offset, (_, start, end)) in &members {
                for symbol in crate::object_file::defined_globals(&data[*start..*end]) {
                    index.entry(symbol.into()).or_default().push(offset);
                }
            }
        }
    }
    Ok(ArchiveTable { index, members })
}
