//! Two "machines" on one: a network namespace the test makes, joined to this one by a veth
//! pair, each end with an address of its own (not loopback), so that an executor and its
//! controller talk across a network link as they would from another machine.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A network namespace and the veth pair that joins it to this one; removed when dropped.
pub struct VethPair {
    /// The namespace's name (`ip netns exec NAME …`).
    pub namespace: String,
    /// The address of this namespace's end.
    pub outside: String,
    /// The address of the namespace's end.
    pub inside: String,
    link: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl VethPair {
    /// Makes the namespace and the pair (root only: `ip netns add`, `ip link add`); each
    /// pair of a test process gets a /30 of its own in 10.231.0.0/16.
    pub fn create() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let namespace = format!("kiln-test-{pid}-{n}");
        let link = format!("kv{}{n}", pid % 1_000_000);
        let peer = format!("{link}p");
        // One /30 per (process, pair): 16,384 of them in the /16.
        let slot = (pid.wrapping_mul(7) + n) % 16_384;
        let base = slot * 4;
        let (third, fourth) = (base / 256, base % 256);
        let outside = format!("10.231.{third}.{}", fourth + 1);
        let inside = format!("10.231.{third}.{}", fourth + 2);
        let pair = VethPair {
            namespace,
            outside,
            inside,
            link,
        };
        let (ns, link) = (pair.namespace.as_str(), pair.link.as_str());
        let (outside, inside) = (
            format!("{}/30", pair.outside),
            format!("{}/30", pair.inside),
        );
        let steps: [&[&str]; 8] = [
            &["netns", "add", ns],
            &["link", "add", link, "type", "veth", "peer", "name", &peer],
            &["link", "set", &peer, "netns", ns],
            &["addr", "add", &outside, "dev", link],
            &["link", "set", link, "up"],
            &["-n", ns, "addr", "add", &inside, "dev", &peer],
            &["-n", ns, "link", "set", &peer, "up"],
            &["-n", ns, "link", "set", "lo", "up"],
        ];
        // A namespace or link of the same name left by a run that was killed (its
        // process id reused) goes first.
        let _ = ip(&["netns", "del", ns]);
        let _ = ip(&["link", "del", link]);
        for step in steps {
            if let Err(why) = ip(step) {
                panic!("a network namespace for the test (root and iproute2 needed): {why}");
            }
        }
        pair
    }

    /// `ip netns exec NAMESPACE PROGRAM`: a command run inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.namespace])
            .arg(program);
        command
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the pair, and so the pair.
        let _ = ip(&["netns", "del", &self.namespace]);
        let _ = ip(&["link", "del", &self.link]);
    }
}
