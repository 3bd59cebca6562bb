//! What produced a result: the machine, the command line and the thing
//! measured. Every JSON report carries it, so that a figure drawn from the
//! file (`nvraid report`) can say where it came from.

use serde_json::{json, Value};

/// The machine a run happened on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Machine {
    /// `uname -n`.
    pub hostname: String,
    /// CPUs this process may run on.
    pub nproc: usize,
    /// `model name` from /proc/cpuinfo (the first CPU's).
    pub cpu_model: String,
    /// `uname -r`.
    pub kernel: String,
}

impl Machine {
    /// The machine this process runs on; a field that cannot be read is
    /// left empty rather than failing the run.
    pub fn this() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == "model name").then(|| value.trim().to_string())
            })
            .unwrap_or_default();
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        Machine {
            hostname: read("/proc/sys/kernel/hostname"),
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            kernel: read("/proc/sys/kernel/osrelease"),
        }
    }

    /// The JSON object every report carries under `machine`.
    pub fn to_json(&self) -> Value {
        json!({
            "hostname": self.hostname,
            "nproc": self.nproc,
            "cpu_model": self.cpu_model,
            "kernel": self.kernel,
        })
    }
}

/// Where a report's numbers came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunContext {
    /// The command line, as typed (arguments joined by spaces, quoted when
    /// they need it).
    pub command: String,
    /// What was measured, in one line: "RAID 0, 4 members, chunk 512 KiB
    /// (m0, m1, m2, m3)", "2 raw members (JBOD)"...
    pub subject: String,
    /// The machine.
    pub machine: Machine,
}

impl RunContext {
    /// This process's command line and machine, measuring `subject`.
    pub fn here(subject: impl Into<String>) -> RunContext {
        RunContext {
            command: command_line(std::env::args()),
            subject: subject.into(),
            machine: Machine::this(),
        }
    }
}

/// Arguments joined into one line a shell would split back the same way.
pub fn command_line(args: impl IntoIterator<Item = String>) -> String {
    let quote = |arg: String| {
        let plain = !arg.is_empty()
            && arg
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c));
        if plain {
            arg
        } else {
            format!("'{}'", arg.replace('\'', r"'\''"))
        }
    };
    let mut args = args.into_iter();
    let program = args.next().map(|p| {
        std::path::Path::new(&p)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or(p)
    });
    program
        .into_iter()
        .chain(args.map(quote))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_quotes_what_a_shell_would_split() {
        let args = ["/usr/bin/nvraid", "bench", "--size", "1G", "a b", "it's"];
        assert_eq!(
            command_line(args.map(String::from)),
            r"nvraid bench --size 1G 'a b' 'it'\''s'"
        );
    }

    #[test]
    fn this_machine_has_a_kernel_and_cpus() {
        let machine = Machine::this();
        assert!(machine.nproc >= 1);
        assert!(!machine.kernel.is_empty());
    }
}
