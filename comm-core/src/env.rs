//! Settings read from the environment, each validated: a bad or absurd value is an
//! `InvalidArgument` that names the variable and the accepted range, never a panic or a
//! silent default.

use std::ops::RangeInclusive;
use std::time::Duration;

use crate::{Error, Result};

/// The deadline of every wait on NCCL/RCCL streams (synchronize, copies to and from the
/// host), in milliseconds: `UNICOMM_TIMEOUT_MS`.
pub const TIMEOUT_VAR: &str = "UNICOMM_TIMEOUT_MS";
/// The deadline when [`TIMEOUT_VAR`] is unset: 10 minutes (PyTorch's NCCL default).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest deadline accepted anywhere: one day (so no `Instant` arithmetic overflows).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// `var` as a whole number in `range` (in `unit`s, named in the error), or `default` when
/// the variable is unset.
pub fn whole_number(
    var: &'static str,
    default: u64,
    range: RangeInclusive<u64>,
    unit: &str,
) -> Result<u64> {
    match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => Ok(default),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::invalid(
            var,
            format!("{v:?} is not a whole number of {unit} in {range:?}"),
        )),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(Error::invalid(
                var,
                format!("{v:?} is not a whole number of {unit} in {range:?}"),
            )),
        },
    }
}

/// `var` as one of `choices` (`(name, value)`; the trimmed variable must equal a name), or
/// `default` when the variable is unset. Anything else, a value that is not Unicode included,
/// is `InvalidArgument` naming the variable and the names.
pub fn choice<T: Copy>(var: &'static str, default: T, choices: &[(&str, T)]) -> Result<T> {
    let v = match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => return Ok(default),
        Err(std::env::VarError::NotUnicode(v)) => v.to_string_lossy().into_owned(),
        Ok(v) => v,
    };
    match choices.iter().find(|(name, _)| *name == v.trim()) {
        Some(&(_, value)) => Ok(value),
        None => {
            let names: Vec<String> = choices.iter().map(|(n, _)| format!("{n:?}")).collect();
            Err(Error::invalid(
                var,
                format!("{v:?} is not one of {}", names.join(", ")),
            ))
        }
    }
}

/// `var` as a switch, `1` (on) or `0` (off), or `default` when unset ([`choice`]'s rules).
pub fn switch(var: &'static str, default: bool) -> Result<bool> {
    choice(var, default, &[("1", true), ("0", false)])
}

/// A deadline in milliseconds from `var` (1..=86400000), or `default`.
pub fn millis(var: &'static str, default: Duration) -> Result<Duration> {
    let max = MAX_TIMEOUT.as_millis() as u64;
    whole_number(var, default.as_millis() as u64, 1..=max, "milliseconds")
        .map(Duration::from_millis)
}

/// The deadline of waits on GPU streams: [`TIMEOUT_VAR`] or [`DEFAULT_TIMEOUT`].
pub fn timeout() -> Result<Duration> {
    millis(TIMEOUT_VAR, DEFAULT_TIMEOUT)
}

/// A deadline given in code: refused outside 1 ms..=1 day, like the variables.
pub fn check_timeout(argument: &'static str, d: Duration) -> Result<Duration> {
    if d >= Duration::from_millis(1) && d <= MAX_TIMEOUT {
        Ok(d)
    } else {
        Err(Error::invalid(
            argument,
            format!("{d:?} is outside 1ms..=1 day"),
        ))
    }
}

/// Reads the file at `path`, at most `max` bytes, without ever blocking: opened non-blocking
/// (a FIFO planted at the path would block `open` itself), refused unless it is a regular
/// file, refused when longer than `max` (`/dev/zero`, a sparse giant): every file a setting
/// names is read through this. `NotFound` passes through.
pub fn read_bounded(path: &std::path::Path, max: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut o, libc::O_NONBLOCK);
    let f = o.open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file (refused)"));
    }
    let mut b = Vec::with_capacity(max.min(1 << 16) + 1);
    f.take(max as u64 + 1).read_to_end(&mut b)?;
    if b.len() > max {
        return Err(std::io::Error::other(format!(
            "longer than the {max} bytes such a file holds (refused)"
        )));
    }
    Ok(b)
}

/// At most the first 64 characters of a value, for an error message (a 10 MiB value gives
/// a short error).
pub fn short(v: &str) -> String {
    match v.char_indices().nth(64) {
        Some((i, _)) => format!("{}...", &v[..i]),
        None => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_words() {
        const V: &str = "UNICOMM_TEST_ENV_WHOLE_NUMBER";
        assert_eq!(whole_number(V, 7, 1..=10, "things").unwrap(), 7);
        for bad in ["0", "11", "abc", "5ms", "-1", "", "18446744073709551616"] {
            std::env::set_var(V, bad);
            let e = whole_number(V, 7, 1..=10, "things").unwrap_err();
            let s = e.to_string();
            assert!(s.contains(V) && s.contains("1..=10"), "{s}");
        }
        std::env::set_var(V, " 10 ");
        assert_eq!(whole_number(V, 7, 1..=10, "things").unwrap(), 10);
        std::env::remove_var(V);
        assert!(check_timeout("t", Duration::ZERO).is_err());
        assert!(check_timeout("t", Duration::from_secs(86_401)).is_err());
        assert!(check_timeout("t", Duration::MAX).is_err());
        assert_eq!(
            check_timeout("t", Duration::from_millis(1)).unwrap(),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn choices() {
        const V: &str = "UNICOMM_TEST_ENV_CHOICE";
        let c = [("one", 1), ("two", 2)];
        std::env::remove_var(V);
        assert_eq!(choice(V, 0, &c).unwrap(), 0);
        std::env::set_var(V, " two ");
        assert_eq!(choice(V, 0, &c).unwrap(), 2);
        for bad in ["", "three", "One", "one two"] {
            std::env::set_var(V, bad);
            let s = choice(V, 0, &c).unwrap_err().to_string();
            assert!(s.contains(V) && s.contains("\"one\", \"two\""), "{s}");
        }
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            std::env::set_var(V, std::ffi::OsStr::from_bytes(b"one\xff"));
            assert!(choice(V, 0, &c).is_err());
        }
        std::env::remove_var(V);
        assert!(switch(V, true).unwrap());
        std::env::set_var(V, "0");
        assert!(!switch(V, true).unwrap());
        std::env::set_var(V, "yes");
        assert!(switch(V, true).is_err());
        std::env::remove_var(V);
    }
}
