//! Slurm's compressed host lists (`gpu[01-03,07]`, `a[1-2],b3`, `rack[1-2]-n[01-04]`):
//! only the first host is needed.

/// The first host of a Slurm host list, as Slurm would expand it: the first item, each
/// bracket replaced by the start of its first range, zero padding kept (`gpu[01-03]` →
/// `gpu01`). `None` for an empty list or `None assigned` (a job never given nodes); an
/// error for unbalanced or empty brackets.
pub fn first_host(list: &str) -> Result<Option<String>, String> {
    let list = list.trim();
    if list.is_empty() || list.eq_ignore_ascii_case("None assigned") || list == "(null)" {
        return Ok(None);
    }
    let mut host = String::new();
    let mut rest = list;
    loop {
        let Some(open) = rest.find(['[', ',', ']']) else {
            host.push_str(rest);
            break;
        };
        host.push_str(&rest[..open]);
        match rest.as_bytes()[open] {
            b',' => break,
            b']' => return Err(format!("unbalanced `]` in host list {list:?}")),
            _ => {}
        }
        let inner_start = open + 1;
        let Some(close) = rest[inner_start..].find(']').map(|c| c + inner_start) else {
            return Err(format!("unclosed `[` in host list {list:?}"));
        };
        let inner = &rest[inner_start..close];
        if inner.contains('[') {
            return Err(format!("nested `[` in host list {list:?}"));
        }
        let first = inner.split(',').next().unwrap_or("");
        let start = first.split('-').next().unwrap_or("").trim();
        if start.is_empty() || !start.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bad range `[{inner}]` in host list {list:?}"));
        }
        host.push_str(start);
        rest = &rest[close + 1..];
    }
    if host.is_empty() {
        return Err(format!("empty host name in host list {list:?}"));
    }
    Ok(Some(host))
}
