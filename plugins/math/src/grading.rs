//! tinker-cookbook's math grading (`recipes/math_rl/math_grading.py`: `extract_boxed` and
//! `grade_answer`) for integer ground truths, which are all this environment asks for.
//!
//! `grade_answer(given, truth)` is true when (a) the two agree after MATH's string
//! normalisation (`normalize_answer`), or (b) after its second normalisation (`_normalize`), or
//! (c) split as tuples, element by element under sympy. With an integer truth, (c) can only
//! hold for a single integer element (sympy compares integers exactly, and a non-integer given
//! element against an integer truth is refused before sympy), so it is an exact comparison
//! here. Not ported, so graded wrong here where tinker may find them right: given answers that
//! still hold a backslash after normalisation (tinker converts them to text with pylatexenc:
//! `\textbf{42}`, an unclosed `\text{42`), and bracketed answers whose element has a leading
//! zero (sympy reads `(07)` as 0·7). Checked against tinker-cookbook's `math_grading.py`
//! (commit 9dfcc3a2, sympy 1.14) on 4000 random answers built from digits, commas, units,
//! brackets, `$`, `%` and LaTeX pieces: the 11 that differ are all of these two kinds.

/// The content of the last `\boxed{...}` (braces balanced, by the position of its closing
/// brace), else of `\boxed N` (letters and digits); None when there is none or a `}` has no
/// `{` before it (tinker raises `ValueError` in both cases).
pub fn extract_boxed(text: &str) -> Option<String> {
    let mut stack = Vec::new();
    let mut last = None;
    for (index, c) in text.char_indices() {
        if c == '{' {
            stack.push(index);
        } else if c == '}' {
            let open = stack.pop()?;
            if text[..open].ends_with("\\boxed") {
                last = Some(text[open + 1..index].to_string());
            }
        }
    }
    if last.is_some() {
        return last;
    }
    // `\boxed\s+([a-zA-Z0-9]+)`: the first such match.
    let mut rest = text;
    while let Some(at) = rest.find("\\boxed") {
        let after = &rest[at + "\\boxed".len()..];
        let spaced = after.trim_start_matches(|c: char| c.is_whitespace());
        let word: String = spaced.chars().take_while(char::is_ascii_alphanumeric).collect();
        if spaced.len() < after.len() && !word.is_empty() {
            return Some(word);
        }
        rest = after;
    }
    None
}

/// `^\\text\{(?P<text>.+?)\}$`: the content of an enclosing `\text{...}` (to the last `}`).
fn strip_enclosing_text(s: &str) -> &str {
    match s.strip_prefix("\\text{").and_then(|rest| rest.strip_suffix('}')) {
        Some(inner) if !inner.is_empty() && !inner.contains('\n') => inner,
        _ => s,
    }
}

/// MATH's `normalize_answer` (`_strip_string`), the steps that can leave a plain integer; the
/// others (fractions, square roots) only rewrite strings that are not integers either way.
pub fn normalize_answer(answer: &str) -> String {
    let answer = strip_enclosing_text(answer.trim()).trim();
    let mut s = answer.replace('\n', "").replace("\\!", "").replace("\\\\", "\\");
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "");
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "");
    if s.contains("\\text{ ") {
        let parts: Vec<&str> = s.split("\\text{ ").collect();
        if parts.len() != 2 {
            // tinker's assertion fails and `normalize_answer` returns its input, stripped.
            return answer.to_string();
        }
        s = parts[0].to_string();
    }
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.");
    if s.starts_with('.') {
        s.insert(0, '0');
    }
    let sides: Vec<&str> = s.split('=').collect();
    if sides.len() == 2 && sides[0].chars().count() <= 2 {
        s = sides[1].to_string();
    }
    s.replace(' ', "")
}

/// Python's `float(s)` for the strings that reach it here (surrounding whitespace allowed).
fn python_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    let special = ["inf", "infinity", "nan"].contains(&body);
    let plain = !body.is_empty() && body.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | '+' | '-'));
    if special || plain { t.parse::<f64>().ok() } else { None }
}

/// `_is_int`: within 1e-7 of an integer (false for infinities and NaN).
fn is_int(x: f64) -> bool {
    x.is_finite() && (x - x.round()).abs() <= 1e-7
}

/// `(\d)(,)(\d\d\d)($|\D)` replaced by `\1\3\4` until nothing changes.
fn strip_properly_formatted_commas(s: &str) -> String {
    let mut current: Vec<char> = s.chars().collect();
    loop {
        let mut out = Vec::with_capacity(current.len());
        let mut i = 0;
        let mut changed = false;
        while i < current.len() {
            let digit = |j: usize| current.get(j).is_some_and(char::is_ascii_digit);
            if i > 0 && current[i] == ',' && digit(i - 1) && digit(i + 1) && digit(i + 2) && digit(i + 3) && !digit(i + 4) {
                // Drop the comma; the three digits and the boundary are kept.
                out.extend_from_slice(&current[i + 1..i + 4]);
                i += 4;
                changed = true;
                // The boundary character itself is consumed by the match in Python.
                if let Some(&c) = current.get(i) {
                    out.push(c);
                    i += 1;
                }
            } else {
                out.push(current[i]);
                i += 1;
            }
        }
        if !changed {
            return out.into_iter().collect();
        }
        current = out;
    }
}

/// `_str_is_int`.
fn str_is_int(s: &str) -> bool {
    python_float(&strip_properly_formatted_commas(s)).is_some_and(is_int)
}

/// `str(int(round(x)))` / `str(int(x))` of a finite float as Python prints the integer.
fn integer_text(x: f64) -> String {
    // `+ 0.0` turns -0 into 0, as `int` does.
    format!("{:.0}", x + 0.0)
}

/// Removes `unit(es)?(s)? *(\^[0-9]+)?` everywhere, left to right.
fn remove_unit(s: &str, unit: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(unit) {
        out.push_str(&rest[..at]);
        let mut tail = &rest[at + unit.len()..];
        tail = tail.strip_prefix("es").unwrap_or(tail);
        tail = tail.strip_prefix('s').unwrap_or(tail);
        let spaced = tail.trim_start_matches(' ');
        tail = match spaced.strip_prefix('^') {
            Some(power) if power.starts_with(|c: char| c.is_ascii_digit()) => power.trim_start_matches(|c: char| c.is_ascii_digit()),
            _ => spaced,
        };
        rest = tail;
    }
    out.push_str(rest);
    out
}

const UNITS: [&str; 16] = ["degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year", "foot", "feet", "inch", "yard"];

/// tinker's `_normalize`, without the LaTeX conversion (see the module's note).
pub fn normalize(expr: &str) -> String {
    let mut s = strip_enclosing_text(expr).to_string();
    s = s.replace("\\%", "%").replace("\\$", "$").replace('$', "").replace('%', "").replace(" or ", " , ").replace(" and ", " , ");
    s = s.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12");
    for unit in UNITS {
        s = remove_unit(&s, unit);
    }
    // `\^ *\\circ`
    while let Some(at) = s.find('^') {
        let after = s[at + 1..].trim_start_matches(' ');
        if after.starts_with("\\circ") {
            let end = s.len() - after.len() + "\\circ".len();
            s.replace_range(at..end, "");
        } else {
            break;
        }
    }
    if s.len() > 1 && s.starts_with('{') && s.ends_with('}') {
        s = s[1..s.len() - 1].to_string();
    }
    // `,\\! *`
    while let Some(at) = s.find(",\\!") {
        let end = at + 3 + s[at + 3..].len() - s[at + 3..].trim_start_matches(' ').len();
        s.replace_range(at..end, "");
    }
    if let Some(x) = python_float(&s).filter(|x| is_int(*x)) {
        s = integer_text(x.round());
    }
    // `- *` -> `-`
    let mut collapsed = String::with_capacity(s.len());
    let mut after_minus = false;
    for c in s.chars() {
        if after_minus && c == ' ' {
            continue;
        }
        after_minus = c == '-';
        collapsed.push(c);
    }
    // `([0-9]) +([0-9])` -> `\1+\2` (implicit mixed numbers), then spaces and braces dropped.
    let chars: Vec<char> = collapsed.chars().collect();
    let mut mixed = String::with_capacity(collapsed.len());
    let mut i = 0;
    while i < chars.len() {
        mixed.push(chars[i]);
        if chars[i].is_ascii_digit() {
            let mut j = i + 1;
            while j < chars.len() && chars[j] == ' ' {
                j += 1;
            }
            if j > i + 1 && j < chars.len() && chars[j].is_ascii_digit() {
                // The second digit is part of this match: it cannot start another.
                mixed.push('+');
                mixed.push(chars[j]);
                i = j + 1;
                continue;
            }
        }
        i += 1;
    }
    let mut s: String = mixed.chars().filter(|c| !matches!(c, ' ' | '{' | '}')).collect::<String>().to_lowercase();
    if str_is_int(&s) {
        let x = python_float(&s.replace(',', "")).expect("an integer string parses without its commas");
        s = integer_text(x.trunc());
    }
    s
}

/// tinker's `grade_answer(given, truth)` for a non-negative integer `truth` (digits only).
pub fn grade_answer(given: &str, truth: &str) -> bool {
    if normalize_answer(given) == truth {
        return true;
    }
    let given = normalize(given);
    if given == truth {
        return true;
    }
    if given.is_empty() {
        return false;
    }
    // split_tuple: one element, or the elements inside enclosing ()[] with none inside.
    let stripped = strip_properly_formatted_commas(&given);
    let tuple = |c: char| "()[]".contains(c);
    let chars: Vec<char> = stripped.chars().collect();
    let elements: Vec<String> = if chars.len() > 2 && tuple(chars[0]) && tuple(chars[chars.len() - 1]) && !chars[1..chars.len() - 1].iter().any(|&c| tuple(c)) {
        chars[1..chars.len() - 1].iter().collect::<String>().split(',').map(|e| e.trim().to_string()).collect()
    } else {
        vec![stripped]
    };
    match elements.as_slice() {
        // An integer against an integer: sympy's difference is zero exactly when they are equal.
        [element] if str_is_int(element) => python_float(&strip_properly_formatted_commas(element)) == truth.parse::<f64>().ok(),
        _ => false,
    }
}
