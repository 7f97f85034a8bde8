//! Where each element of a JSON document's top-level `items` array starts, as 1-based
//! lines, so that a skipped pod can be named by `file:line` (`serde_json`'s values carry
//! no positions). Only called on text `serde_json` has accepted.

/// The line each element of the top-level object's `items` array starts on, in order.
pub(super) fn item_lines(text: &str) -> Vec<usize> {
    let b = text.as_bytes();
    let mut starts = Vec::new();
    let mut depth = 0usize;
    let mut last_string: Option<(usize, usize)> = None;
    let mut key_is_items = false;
    let mut in_items = false;
    let mut expect_item = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if expect_item && !c.is_ascii_whitespace() {
            expect_item = false;
            if c != b']' {
                starts.push(i);
            }
        }
        match c {
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                last_string = Some((start, i.min(b.len())));
            }
            b':' if depth == 1 => {
                key_is_items = last_string.is_some_and(|(s, e)| &b[s..e] == b"items");
            }
            b'{' | b'[' => {
                depth += 1;
                if c == b'[' && depth == 2 && key_is_items {
                    in_items = true;
                    expect_item = true;
                }
            }
            b'}' | b']' => {
                if in_items && depth == 2 {
                    in_items = false;
                }
                depth = depth.saturating_sub(1);
            }
            b',' if in_items && depth == 2 => expect_item = true,
            _ => {}
        }
        i += 1;
    }
    let mut line = 1;
    let mut at = 0;
    starts
        .into_iter()
        .map(|s| {
            line += b[at..s].iter().filter(|&&c| c == b'\n').count();
            at = s;
            line
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_items_skip_strings_nested_arrays_and_other_keys() {
        let text = "{\n  \"kind\": \"List\",\n  \"x\": [1, 2],\n  \"items\": [\n    {\"a\": \"[,]\\\"\"},\n    {\"b\": [3, {\"items\": [4]}]}, 7,\n    \"s\"\n  ]\n}\n";
        assert_eq!(item_lines(text), vec![5, 6, 6, 7]);
        assert_eq!(item_lines("{\"items\": []}"), Vec::<usize>::new());
    }
}
