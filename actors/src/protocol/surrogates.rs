//! Lone UTF-16 surrogates in JSON string escapes.
//!
//! Node's `JSON.stringify` and Python's `json.dumps` write a string cut in
//! the middle of an emoji as `"\ud83d"`: well-formed JSON text, but no
//! Unicode scalar value, so serde_json refuses the whole message. A probe's
//! agent lost a permission request that way (never answered) and the end of
//! its turn (the turn hung). Such an escape is read as its own six
//! characters (`\ud83d` as text, the backslash escaped), not as U+FFFD:
//! two different ones stay different (two request ids `"\ud800"` and
//! `"\udfff"` read as one U+FFFD made the second a reused id), and the
//! operator sees what was cut. A message without one is left to fail as it
//! did.

/// `body` with every escaped lone surrogate's backslash escaped (so it
/// reads as the text `\uXXXX`), or `None` when it has none (its parse
/// error is then something else).
pub fn mend(body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    let mut changed = false;
    let mut in_string = false;
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if !in_string || (b != b'"' && b != b'\\') {
            in_string ^= b == b'"';
            out.push(b);
            i += 1;
            continue;
        }
        if b == b'"' {
            in_string = false;
            out.push(b);
            i += 1;
            continue;
        }
        // A backslash in a string: an escape.
        let taken = match unicode_escape(body, i) {
            // A high surrogate followed by a low one: a pair, kept.
            Some(0xD800..=0xDBFF)
                if unicode_escape(body, i + 6)
                    .is_some_and(|low| (0xDC00..=0xDFFF).contains(&low)) =>
            {
                12
            }
            Some(0xD800..=0xDFFF) => {
                out.push(b'\\');
                out.extend_from_slice(&body[i..i + 6]);
                changed = true;
                i += 6;
                continue;
            }
            Some(_) => 6,
            None => 2,
        };
        let end = (i + taken).min(body.len());
        out.extend_from_slice(&body[i..end]);
        i = end;
    }
    changed.then_some(out)
}

/// The code unit of a `\uXXXX` escape starting at `at`.
fn unicode_escape(body: &[u8], at: usize) -> Option<u32> {
    let escape = body.get(at..at + 6)?;
    if escape[0] != b'\\' || escape[1] != b'u' {
        return None;
    }
    let hex = std::str::from_utf8(&escape[2..]).ok()?;
    u32::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mended(s: &str) -> Option<String> {
        mend(s.as_bytes()).map(|m| String::from_utf8(m).expect("utf8"))
    }

    #[test]
    fn a_lone_surrogate_reads_as_its_escape_and_stays_distinct() {
        assert_eq!(
            mended(r#"{"t":"cut \ud83d","u":"\ude00 x"}"#).as_deref(),
            Some(r#"{"t":"cut \\ud83d","u":"\\ude00 x"}"#)
        );
        let v: serde_json::Value =
            serde_json::from_str(&mended(r#"{"t":"a\ud83d"}"#).expect("mended")).expect("parses");
        assert_eq!(v["t"], "a\\ud83d");
        let two: serde_json::Value =
            serde_json::from_str(&mended(r#"["\ud800","\udfff"]"#).expect("mended"))
                .expect("parses");
        assert_ne!(two[0], two[1]);
    }

    #[test]
    fn pairs_other_escapes_and_text_outside_strings_are_left_alone() {
        assert_eq!(mended(r#"{"t":"\ud83d\ude00 ok \\ud83d \"\u0041"}"#), None);
        // Outside a string there is nothing to mend.
        assert_eq!(mended(r#"{"t": 1} \ud83d"#), None);
        // A cut escape at the end stays as it is (and fails to parse).
        assert_eq!(mended(r#"{"t":"\ud8"#), None);
    }
}
