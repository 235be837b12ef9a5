//! Ethernet MAC addresses as text (`aa:bb:cc:dd:ee:ff`), the one form the VMM command
//! line, the firewall rules, the guest protocol and sysfs all use.

/// `mac` as six lower-case hex octets separated by `:`.
pub fn format(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The bytes of a MAC written as six `:`-separated two-digit hex octets (either case).
pub fn parse(text: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = text.split(':');
    for b in out.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let mac = [0x02, 0x53, 0x50, 0x00, 0x02, 0x0f];
        assert_eq!(format(&mac), "02:53:50:00:02:0f");
        assert_eq!(parse("02:53:50:00:02:0F"), Some(mac));
        for bad in [
            "",
            "02:53:50:00:02",
            "02:53:50:00:02:0f:00",
            "2:53:50:00:02:0f",
            "zz:53:50:00:02:0f",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
