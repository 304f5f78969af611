//! The plain text tables of `colony audit` and `colony usage`: columns padded to their widest
//! cell, two spaces apart, the last column unpadded, trailing spaces trimmed.

/// Prints `rows` (the first is the header) with the columns whose `right[i]` is set aligned
/// right, the others left.
pub fn print<const N: usize>(rows: &[[String; N]], right: [bool; N]) {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else if right[i] {
                line.push_str(&format!("{cell:>w$}  ", w = widths[i]));
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", line.trim_end());
    }
}
