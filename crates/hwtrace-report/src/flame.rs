//! SVG flame graphs from folded stacks, drawn by inferno (the Rust port of
//! Brendan Gregg's flamegraph.pl), so that the picture is the one people
//! already know how to read: width is instructions, stacks grow upwards.

use std::io::Write;

/// Why no flame graph was drawn.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlameError {
    /// The trace executed no instruction inside any frame.
    #[error("no stacks to draw: the trace has no executed instructions")]
    Empty,
    /// inferno could not write the SVG.
    #[error("writing the flame graph")]
    Write(#[from] std::io::Error),
}

/// Draws `folded` (lines of `a;b;c N`, as
/// [`FoldedStacks::lines`](crate::calls::FoldedStacks::lines) gives) as an
/// SVG flame graph titled `title`. Colours are chosen from the function
/// names, so the same trace always draws the same picture.
pub fn write_svg(folded: &[String], title: &str, out: &mut dyn Write) -> Result<(), FlameError> {
    if folded.is_empty() {
        return Err(FlameError::Empty);
    }
    let mut options = inferno::flamegraph::Options::default();
    title.clone_into(&mut options.title);
    "instructions".clone_into(&mut options.count_name);
    options.hash = true;
    options.deterministic = true;
    inferno::flamegraph::from_lines(&mut options, folded.iter().map(String::as_str), out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_become_svg_frames() {
        let folded = ["main 4".to_owned(), "main;work 96".to_owned()];
        let mut svg = Vec::new();
        write_svg(&folded, "test flame", &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..80]);
        assert!(svg.contains("test flame"));
        assert!(svg.contains("work (96 instructions, 96.00%)"), "{svg}");
        assert!(svg.contains("main (100 instructions, 100.00%)"), "{svg}");
    }

    #[test]
    fn nothing_to_draw_is_an_error() {
        let mut svg = Vec::new();
        assert!(matches!(
            write_svg(&[], "t", &mut svg),
            Err(FlameError::Empty)
        ));
    }
}
