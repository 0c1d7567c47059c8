//! Just enough ELF to tell a statically linked program from a dynamically linked one: the
//! program header `PT_INTERP` names the dynamic loader; a static (or static-pie) program has
//! none.

/// What the image build needs to know about an executable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// The ELF interpreter (`/lib64/ld-linux-x86-64.so.2`), `None` when statically linked.
    pub interpreter: Option<String>,
}

fn u16_at(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(d.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(at..at + 8)?.try_into().ok()?))
}

/// Reads the program headers of a 64-bit little-endian ELF file.
pub fn inspect(data: &[u8]) -> Result<Info, String> {
    if data.get(..4) != Some(b"\x7fELF") {
        return Err("no ELF magic".into());
    }
    if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let short = || "truncated ELF header".to_string();
    let phoff = usize::try_from(u64_at(data, 0x20).ok_or_else(short)?).map_err(|_| short())?;
    let phentsize = usize::from(u16_at(data, 0x36).ok_or_else(short)?);
    let phnum = usize::from(u16_at(data, 0x38).ok_or_else(short)?);
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        if u32_at(data, at).ok_or_else(short)? != PT_INTERP {
            continue;
        }
        let offset =
            usize::try_from(u64_at(data, at + 8).ok_or_else(short)?).map_err(|_| short())?;
        let size =
            usize::try_from(u64_at(data, at + 32).ok_or_else(short)?).map_err(|_| short())?;
        let raw = data.get(offset..offset + size).ok_or_else(short)?;
        let path = raw.split(|b| *b == 0).next().unwrap_or_default();
        return Ok(Info {
            interpreter: Some(String::from_utf8_lossy(path).into_owned()),
        });
    }
    Ok(Info { interpreter: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_is_read() {
        let exe = std::env::current_exe().unwrap();
        let info = inspect(&std::fs::read(exe).unwrap()).unwrap();
        // Test binaries are built like the workspace's: dynamically linked against glibc.
        if let Some(i) = info.interpreter {
            assert!(i.starts_with('/'), "{i}");
        }
    }

    #[test]
    fn not_elf_is_an_error() {
        assert!(inspect(b"#!/bin/sh\n").is_err());
        assert!(inspect(b"\x7fELF").is_err());
    }
}
