//! `nvraid topology`: the report comes from nvraid-topology; `--measure`
//! reads each device with the bench engine (the same queues and runner as
//! `nvraid bench`).

use anyhow::Result;
use nvraid_array::FanoutTarget;
use nvraid_bench::{run_job, JobSpec, RwMode};
use nvraid_io::queue::Target;
use nvraid_member::{Member, OpenOptions};
use nvraid_topology::cli::TopologyArgs;
use nvraid_topology::measure::{Measured, Measurer};
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Sequential 1 MiB reads at queue depth 8 on one worker, read-only, on the
/// engine `nvraid bench --engine auto` would pick for the device.
struct BenchMeasurer;

impl Measurer for BenchMeasurer {
    fn seq_read(&self, dev_path: &Path, duration: Duration) -> io::Result<Measured> {
        let spec = dev_path.to_string_lossy();
        let member = Member::open(
            &spec,
            OpenOptions {
                write: false,
                create_bytes: None,
                direct: true,
                ..Default::default()
            },
        )
        .map_err(io::Error::other)?;
        let direct_io = member.is_direct();
        let engine = nvraid_bench::engine_for(nvraid_bench::cli::Engine::Auto, &[&member]);
        let target: Arc<dyn Target> = Arc::new(FanoutTarget::raw(Arc::new(member), engine));
        let mut job = JobSpec::new(RwMode::Read);
        job.bs_bytes = 1 << 20;
        job.iodepth = 8;
        job.runtime = duration;
        job.ramp = Duration::from_millis(200);
        let result = run_job(&job, &[target], None).map_err(io::Error::other)?;
        let seconds = result.runtime_ns as f64 / 1e9;
        let cpu_ns = (result.cpu.user_ns + result.cpu.sys_ns) as f64;
        Ok(Measured {
            bytes_per_sec: result.read.bytes as f64 / seconds,
            iops: result.read.ios as f64 / seconds,
            cpu_busy_fraction: (cpu_ns / result.runtime_ns as f64).min(1.0),
            direct_io,
        })
    }
}

pub fn run(args: &TopologyArgs) -> Result<u8> {
    let measurer = BenchMeasurer;
    let mut stdout = io::stdout().lock();
    let code = nvraid_topology::cli::run(
        args,
        args.measure.then_some(&measurer as &dyn Measurer),
        &mut stdout,
    )?;
    Ok(code as u8)
}
