//! The files of the credential decision log: one directory per tenant, one file per UTC day
//! (`<dir>/<tenant>/<YYYY-MM-DD>.jsonl`), appended with `O_APPEND` (mode 0600), capped per
//! tenant and day, removed only when older than the retention; and reading a file's lines
//! backwards (newest first) in bounded memory.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::ControlFlow;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use space_core::id::TenantId;

use super::{AuditError, MAX_AUDIT_LINE_LEN};
use crate::fsutil;

const DAY_MS: i64 = 86_400_000;
/// Extension of a day's file.
const EXTENSION: &str = "jsonl";
/// Open day files kept at once (one per tenant that wrote today).
const MAX_OPEN: usize = 256;
/// Bytes read at a time when reading backwards.
const CHUNK: usize = 64 * 1024;

/// The UTC day (days since the Unix epoch) of `ts_ms`.
pub(super) fn day_of(ts_ms: i64) -> i64 {
    ts_ms.div_euclid(DAY_MS)
}

fn unix_epoch_julian() -> i32 {
    time::OffsetDateTime::UNIX_EPOCH.date().to_julian_day()
}

/// `YYYY-MM-DD` of a day.
pub(super) fn day_name(day: i64) -> Option<String> {
    let julian = i32::try_from(day).ok()?.checked_add(unix_epoch_julian())?;
    let d = time::Date::from_julian_day(julian).ok()?;
    Some(format!(
        "{:04}-{:02}-{:02}",
        d.year(),
        u8::from(d.month()),
        d.day()
    ))
}

/// The day a file is named for (`YYYY-MM-DD.jsonl`), if it is one of ours.
pub(super) fn day_of_file(name: &str) -> Option<i64> {
    let stem = name.strip_suffix(&format!(".{EXTENSION}"))?;
    let mut parts = stem.splitn(3, '-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    if (y.len(), m.len(), d.len()) != (4, 2, 2) {
        return None;
    }
    let month = time::Month::try_from(m.parse::<u8>().ok()?).ok()?;
    let date = time::Date::from_calendar_date(y.parse().ok()?, month, d.parse().ok()?).ok()?;
    Some(i64::from(date.to_julian_day() - unix_epoch_julian()))
}

/// A tenant's directory.
pub(super) fn tenant_dir(dir: &Path, tenant: &TenantId) -> PathBuf {
    // A tenant id is `tnt-` and base-36 characters: always one plain path component.
    dir.join(tenant.as_str())
}

/// A tenant's day files, newest first.
pub(super) fn tenant_days(dir: &Path, tenant: &TenantId) -> io::Result<Vec<(i64, PathBuf)>> {
    let mut days = Vec::new();
    let entries = match fs::read_dir(tenant_dir(dir, tenant)) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(days),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if let Some(day) = entry.file_name().to_str().and_then(day_of_file) {
            days.push((day, entry.path()));
        }
    }
    days.sort_by_key(|d| std::cmp::Reverse(d.0));
    Ok(days)
}

/// The tenants with a directory.
pub(super) fn tenants(dir: &Path) -> io::Result<Vec<TenantId>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        if let Some(t) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) {
            out.push(t);
        }
    }
    Ok(out)
}

/// Removes every tenant's day files before `oldest_kept` (a day), and tenant directories
/// left empty; returns how many files went.
pub(super) fn prune(dir: &Path, oldest_kept: i64) -> io::Result<usize> {
    let mut removed = 0;
    for tenant in tenants(dir)? {
        for (day, path) in tenant_days(dir, &tenant)? {
            if day < oldest_kept {
                fs::remove_file(&path)?;
                removed += 1;
            }
        }
        // Only succeeds when empty.
        let _ = fs::remove_dir(tenant_dir(dir, &tenant));
    }
    Ok(removed)
}

struct OpenDay {
    day: i64,
    path: PathBuf,
    file: File,
    len: u64,
}

/// The open day files, one per tenant that wrote lately.
pub(super) struct DayFiles {
    dir: PathBuf,
    daily_cap: u64,
    open: HashMap<TenantId, OpenDay>,
}

impl DayFiles {
    pub(super) fn new(dir: PathBuf, daily_cap: u64) -> Self {
        DayFiles {
            dir,
            daily_cap,
            open: HashMap::new(),
        }
    }

    /// Appends `line` (one event, newline included) to the file of `tenant`'s day of
    /// `ts_ms`, unless that passes the tenant's daily cap.
    pub(super) fn append(
        &mut self,
        tenant: &TenantId,
        ts_ms: i64,
        line: &[u8],
    ) -> Result<(), AuditError> {
        let day = day_of(ts_ms);
        if self.open.len() >= MAX_OPEN && !self.open.contains_key(tenant) {
            self.open.clear();
        }
        let open = match self.open.entry(tenant.clone()) {
            Entry::Occupied(mut held) => {
                if held.get().day != day {
                    held.insert(open_day(&self.dir, tenant, day)?);
                }
                held.into_mut()
            }
            Entry::Vacant(none) => none.insert(open_day(&self.dir, tenant, day)?),
        };
        if open.len + line.len() as u64 > self.daily_cap {
            return Err(AuditError::TenantDayFull {
                limit: self.daily_cap,
            });
        }
        open.file.write_all(line).map_err(|source| AuditError::Io {
            path: open.path.clone(),
            source,
        })?;
        open.len += line.len() as u64;
        Ok(())
    }
}

/// Opens (creating it) the file of `tenant`'s `day` under `dir`, for appending.
fn open_day(dir: &Path, tenant: &TenantId, day: i64) -> Result<OpenDay, AuditError> {
    let tdir = tenant_dir(dir, tenant);
    let name = day_name(day).ok_or(AuditError::Clock(day))?;
    let path = tdir.join(format!("{name}.{EXTENSION}"));
    let io_err = |source| AuditError::Io {
        path: path.clone(),
        source,
    };
    fsutil::ensure_private_dir(&tdir).map_err(io_err)?;
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(fsutil::PRIVATE_FILE_MODE)
        .open(&path)
        .map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    Ok(OpenDay {
        day,
        path,
        file,
        len,
    })
}

/// Calls `each` with the file's complete lines, last first, until it breaks; reads
/// [`CHUNK`] bytes at a time and skips a line longer than [`MAX_AUDIT_LINE_LEN`] (none is
/// written; a torn or foreign one is not an event).
pub(super) fn lines_backwards(
    path: &Path,
    mut each: impl FnMut(&[u8]) -> ControlFlow<()>,
) -> io::Result<()> {
    let mut file = File::open(path)?;
    let mut end = file.metadata()?.len();
    // Bytes after the last newline seen so far (the start of a line whose head is earlier).
    let mut tail: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    while end > 0 {
        let start = end.saturating_sub(CHUNK as u64);
        let n = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk[..n])?;
        let mut buf = chunk[..n].to_vec();
        buf.append(&mut tail);
        // Every line in `buf` but the first is complete; the first may go on before `start`.
        let mut rest = buf.as_slice();
        while let Some(nl) = rest[..rest.len().saturating_sub(1)]
            .iter()
            .rposition(|&b| b == b'\n')
        {
            let line = &rest[nl + 1..];
            let line = line.strip_suffix(b"\n").unwrap_or(line);
            if !line.is_empty() && line.len() < MAX_AUDIT_LINE_LEN && each(line).is_break() {
                return Ok(());
            }
            rest = &rest[..=nl];
        }
        tail = if rest.len() <= MAX_AUDIT_LINE_LEN {
            rest.to_vec()
        } else {
            Vec::new()
        };
        end = start;
    }
    let line = tail.strip_suffix(b"\n").unwrap_or(&tail);
    if !line.is_empty() && line.len() < MAX_AUDIT_LINE_LEN {
        let _ = each(line);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_named_by_their_utc_date_and_back() {
        assert_eq!(day_name(0).as_deref(), Some("1970-01-01"));
        let day = day_of(1_764_633_600_000); // 2025-12-02T00:00:00Z
        assert_eq!(day_name(day).as_deref(), Some("2025-12-02"));
        assert_eq!(day_of_file("2025-12-02.jsonl"), Some(day));
        assert_eq!(day_of(1_764_633_599_999), day - 1);
        for bad in [
            "2025-12-2.jsonl",
            "2025-13-01.jsonl",
            "x.jsonl",
            "2025-12-02.json",
            "",
        ] {
            assert_eq!(day_of_file(bad), None, "{bad}");
        }
    }

    #[test]
    fn lines_are_read_backwards_across_chunks_in_bounded_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let lines: Vec<String> = (0..20_000)
            .map(|i| format!("line {i} {}", "x".repeat(i % 50)))
            .collect();
        let mut text = lines.join("\n");
        text.push('\n');
        // A torn last line (a crash mid-write) is seen too; the reader's caller skips it.
        text.push_str("{\"torn");
        fs::write(&path, &text).unwrap();
        let mut seen = Vec::new();
        lines_backwards(&path, |l| {
            seen.push(String::from_utf8(l.to_vec()).unwrap());
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(seen[0], "{\"torn");
        let mut rest: Vec<String> = seen[1..].to_vec();
        rest.reverse();
        assert_eq!(rest, lines);

        // Stops when told to.
        let mut n = 0;
        lines_backwards(&path, |_| {
            n += 1;
            if n == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
        assert_eq!(n, 3);
        // An empty file has no lines.
        fs::write(&path, "").unwrap();
        lines_backwards(&path, |_| panic!("no line")).unwrap();
    }

    #[test]
    fn a_tenants_day_is_capped_and_old_days_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = DayFiles::new(dir.path().to_owned(), 100);
        let (a, b) = (TenantId::generate(), TenantId::generate());
        let line = [b'x'; 40];
        files.append(&a, 0, &line).unwrap();
        files.append(&a, 1, &line).unwrap();
        assert!(matches!(
            files.append(&a, 2, &line),
            Err(AuditError::TenantDayFull { limit: 100 })
        ));
        // Another tenant, and the next day, are not affected.
        files.append(&b, 0, &line).unwrap();
        files.append(&a, DAY_MS, &line).unwrap();
        assert_eq!(tenant_days(dir.path(), &a).unwrap().len(), 2);
        assert_eq!(prune(dir.path(), 1).unwrap(), 2, "day 0 of both tenants");
        assert_eq!(
            tenant_days(dir.path(), &a).unwrap(),
            vec![(1, tenant_dir(dir.path(), &a).join("1970-01-02.jsonl"))]
        );
        assert!(
            !tenant_dir(dir.path(), &b).exists(),
            "an empty tenant directory goes"
        );
    }
}
