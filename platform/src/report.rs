//! An error as one line for a reader who sees only text (a log line, the
//! cowork app's error message): the error and each of its sources.

use std::error::Error;

/// `e` and its sources, `: `-separated.
pub fn chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn an_error_is_said_with_each_of_its_sources_in_order() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(chain(&e), "outer: inner");
        assert_eq!(chain(&std::io::Error::other("alone")), "alone");
    }
}
