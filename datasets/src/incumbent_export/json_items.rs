//! Where each element of a JSON document's top-level `items` array starts, as 1-based
//! lines, so that a skipped pod can be named by `file:line` (`serde_json`'s values carry
//! no positions), and where each top-level `items` key is (a reader keeps only the last
//! of repeated keys, so a second one would silently drop the first list). Only called on
//! text `serde_json` has accepted.

/// Positions in a JSON document, as 1-based lines.
#[derive(Debug, PartialEq)]
pub(super) struct ItemsLayout {
    /// Each top-level `items` key.
    pub keys: Vec<usize>,
    /// Each element of a top-level `items` array, in order.
    pub items: Vec<usize>,
}

/// Where the top-level object's `items` keys and their arrays' elements are.
pub(super) fn items_layout(text: &str) -> ItemsLayout {
    let b = text.as_bytes();
    let mut starts = Vec::new();
    let mut keys = Vec::new();
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
                if let (true, Some((s, _))) = (key_is_items, last_string) {
                    keys.push(s);
                }
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
    ItemsLayout {
        keys: lines_of(b, keys),
        items: lines_of(b, starts),
    }
}

/// The lines of ascending byte offsets.
fn lines_of(b: &[u8], offsets: Vec<usize>) -> Vec<usize> {
    let mut line = 1;
    let mut at = 0;
    offsets
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
        let layout = items_layout(text);
        assert_eq!(layout.items, vec![5, 6, 6, 7]);
        // The nested `items` is not a top-level key.
        assert_eq!(layout.keys, vec![4]);
        assert_eq!(
            items_layout("{\"items\": []}"),
            ItemsLayout {
                keys: vec![1],
                items: Vec::new()
            }
        );
    }

    #[test]
    fn every_top_level_items_key_is_found() {
        let text = "{\"items\": [1],\n \"kind\": \"items\",\n \"items\": [2, 3]}";
        let layout = items_layout(text);
        assert_eq!(layout.keys, vec![1, 3]);
        assert_eq!(layout.items, vec![1, 3, 3]);
    }
}
