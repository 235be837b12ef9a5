//! Bounding text that crosses a boundary (logs, error messages, audit fields).

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
/// (`str::floor_char_boundary` does this from Rust 1.91; this crate supports 1.85.)
pub fn prefix_at_char_boundary(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_on_a_character_boundary() {
        assert_eq!(prefix_at_char_boundary("héllo", 2), "h");
        assert_eq!(prefix_at_char_boundary("héllo", 3), "hé");
        assert_eq!(prefix_at_char_boundary("héllo", 100), "héllo");
        assert_eq!(prefix_at_char_boundary("é", 0), "");
    }
}
