//! What `nvraid run NAME` hands to `nvraid serve`: the flags a configured
//! array is served with.

use crate::config::{AlertSettings, ArrayEntry, Export};
use crate::incremental::RunDir;
use std::path::Path;

/// The ublk device number to ask for: the one the registry holds for the
/// array while that device still exists (`DEV/ublkcN`: a daemon that
/// crashed or was restarted left it, and the next one takes it over, with
/// a filesystem mounted on it); else the configured number; else `auto`.
pub fn ublk_id(entry: &ArrayEntry, run: &RunDir, dev: &Path) -> String {
    if let Some(id) = run.ublk_id(&entry.name) {
        if dev.join(format!("ublkc{id}")).exists() {
            return id.to_string();
        }
    }
    match entry.export {
        Export::Ublk(Some(id)) => id.to_string(),
        _ => "auto".into(),
    }
}

/// `nvraid serve`'s arguments (after `serve`) for `entry` on `members`.
/// `ublk`: from [`ublk_id`], used when the array is exported as ublk.
pub fn serve_args(
    entry: &ArrayEntry,
    alerts: &AlertSettings,
    run: &RunDir,
    ublk: &str,
    members: &[String],
) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let mut args: Vec<String> = Vec::new();
    match &entry.export {
        Export::Ublk(_) => {
            args.push(format!("--ublk={ublk}"));
            args.push("--ublk-record".into());
            args.push(path(&run.ublk_record(&entry.name)));
        }
        Export::Nbd(address) => {
            args.push("--listen".into());
            args.push(address.clone());
        }
        Export::None => {
            args.push("--listen".into());
            args.push(format!("unix:{}", path(&run.socket(&entry.name))));
        }
    }
    args.push("--control".into());
    args.push(path(&run.control(&entry.name)));
    // A member that was missing at the last start is back: re-added by
    // the bitmap, as md's incremental assembly does.
    args.push("--re-add".into());
    if let Some(program) = &alerts.program {
        args.push("--alert-program".into());
        args.push(path(program));
    }
    if let Some(mail) = &alerts.mailaddr {
        args.push("--alert-mail".into());
        args.push(mail.clone());
    }
    if let Some(metrics) = entry.metrics.as_ref().or(alerts.metrics.as_ref()) {
        args.push("--metrics".into());
        args.push(metrics.clone());
    }
    args.push("--".into());
    args.extend(members.iter().cloned());
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::incremental::RunDir;
    use std::path::PathBuf;

    fn entry(export: Export) -> ArrayEntry {
        ArrayEntry {
            name: "data".into(),
            uuid: [1; 16],
            export,
            degraded_after: 30,
            metrics: None,
            line: 1,
        }
    }

    #[test]
    fn a_ublk_array_with_alerts() {
        let run = RunDir {
            root: PathBuf::from("/run/nvraid"),
        };
        let alerts = AlertSettings {
            program: Some("/usr/local/bin/alert".into()),
            mailaddr: Some("root".into()),
            mailfrom: None,
            metrics: Some("127.0.0.1:9177".into()),
        };
        let members = vec!["/dev/vdb".to_string(), "/dev/vdc".to_string()];
        let args = serve_args(&entry(Export::Ublk(None)), &alerts, &run, "auto", &members);
        assert_eq!(
            args.join(" "),
            "--ublk=auto --ublk-record /run/nvraid/ublk/data --control /run/nvraid/data.ctl --re-add \
             --alert-program /usr/local/bin/alert --alert-mail root --metrics 127.0.0.1:9177 \
             -- /dev/vdb /dev/vdc"
        );
        let args = serve_args(
            &entry(Export::Nbd("tcp:0.0.0.0:10809".into())),
            &AlertSettings::default(),
            &run,
            "auto",
            &members[..1],
        );
        assert_eq!(
            args.join(" "),
            "--listen tcp:0.0.0.0:10809 --control /run/nvraid/data.ctl --re-add -- /dev/vdb"
        );
        // An array's own address is its daemon's, whatever METRICS says.
        let own = ArrayEntry {
            metrics: Some("[::1]:9200".into()),
            ..entry(Export::Nbd("unix:/s".into()))
        };
        let args = serve_args(&own, &alerts, &run, "auto", &members[..1]);
        assert!(
            args.join(" ").ends_with("--metrics [::1]:9200 -- /dev/vdb"),
            "{args:?}"
        );
        let args = serve_args(
            &entry(Export::None),
            &AlertSettings::default(),
            &run,
            "auto",
            &members[..1],
        );
        assert_eq!(
            args.join(" "),
            "--listen unix:/run/nvraid/data.sock --control /run/nvraid/data.ctl --re-add -- /dev/vdb"
        );
    }

    #[test]
    fn the_recorded_device_is_taken_over_only_while_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir {
            root: dir.path().join("run"),
        };
        let dev = dir.path().join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        assert_eq!(ublk_id(&entry(Export::Ublk(None)), &run, &dev), "auto");
        assert_eq!(ublk_id(&entry(Export::Ublk(Some(4))), &run, &dev), "4");
        crate::config::write_atomically(&run.ublk_record("data"), "7\n").unwrap();
        assert_eq!(
            ublk_id(&entry(Export::Ublk(Some(4))), &run, &dev),
            "4",
            "device 7 is gone"
        );
        std::fs::write(dev.join("ublkc7"), "").unwrap();
        assert_eq!(ublk_id(&entry(Export::Ublk(Some(4))), &run, &dev), "7");
    }
}
