//! What a link is asked to take and make: the request a user's call, a lookup or a lazy
//! function's first call hands to [`crate::link_job`].

use crate::module::Module;
use kiln_link::ObjectInput;
use rustc_hash::FxHashMap;

/// The names whose references a link routes through call-through stubs
/// ([`crate::Jit::link_swappable`]): each name's stub, all in `stubs`.
pub(crate) struct CallsThrough {
    /// The stubs' module (the link's module uses it).
    pub(crate) stubs: Module,
    /// Each function's stub.
    pub(crate) addresses: FxHashMap<Box<str>, u64>,
}

/// Whether a link publishes its module's definitions in its library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    /// A module of the library: it takes what is pending, holds the library's link lock,
    /// and its exports join the library's index.
    Yes,
    /// A module kept out of every index (the body of a call-through stub): linked alone,
    /// its names resolved as the library resolves them, no lock held (it may link the
    /// library's lazy objects).
    No,
}

/// What a link takes and makes.
pub(crate) struct LinkRequest<'w> {
    /// An object linked with what is pending (or alone, for a body).
    pub(crate) extra: Option<ObjectInput>,
    /// Shown to plugins in place of the object of the same name (same sections, other
    /// symbols: call-through stubs are shown as `NAME.stub`).
    pub(crate) shown: Option<ObjectInput>,
    /// Names whose lazy objects the link takes (with what those need).
    pub(crate) wanted: &'w [&'w str],
    pub(crate) publish: Publish,
    /// Whether the report has the link's phase and pass times (else no clock is read).
    pub(crate) times: bool,
    /// The key of the module's image in the session's image cache: mapped from it if
    /// there, stored in it after the link if not.
    pub(crate) image: Option<kiln_cache::CacheKey>,
    /// References to these of the inputs' functions reach their stubs.
    pub(crate) through: Option<&'w CallsThrough>,
}

impl LinkRequest<'_> {
    /// A module of the library, of what is pending.
    pub(crate) fn module() -> Self {
        LinkRequest {
            extra: None,
            shown: None,
            wanted: &[],
            publish: Publish::Yes,
            times: false,
            image: None,
            through: None,
        }
    }

    /// The body of a lazy function: `object` alone.
    pub(crate) fn body(object: ObjectInput) -> Self {
        LinkRequest {
            extra: Some(object),
            publish: Publish::No,
            ..Self::module()
        }
    }

    /// With `object` too.
    pub(crate) fn with(mut self, object: ObjectInput) -> Self {
        self.extra = Some(object);
        self
    }
}
