//! zram-generator's size expressions (`zram-size`, `zram-resident-limit`, and the output of a
//! `set!` program): arithmetic in MiB over `ram` (MemTotal in MiB) and the variables `set!`
//! lines defined.
//!
//! The language is the part of fasteval's (zram-generator's evaluator) that its manual lists:
//! `+ - * / % ^` (`^` binds tightest and to the right), parentheses or square brackets, numbers
//! with fasteval's SI suffixes (`500k` is 500 000, `2G` is 2e9: decimal, and in MiB like any
//! number here), `e()`, `pi()`, `int`, `ceil`, `floor`, `abs`, `sign`, `round([modulus,] x)`,
//! `log([base,] x)` (base 10 by default), `min` and `max` of one or more values, and the
//! trigonometric functions. fasteval's comparisons and logical operators are not: an
//! expression using them is an error here, not a silently different size.

use std::collections::BTreeMap;

/// How deeply an expression may nest (parentheses, function arguments, unary minus, `^`). The
/// parser recurses once per level: without a bound, a file of a few hundred thousand `(`
/// overflows the stack and kills the process instead of giving an error.
pub const MAX_DEPTH: u32 = 100;

/// The names an expression may use besides `ram`: what `set!` lines defined.
pub type Vars = BTreeMap<String, f64>;

/// Evaluates a zram-size expression (result in MiB) with `ram` bound to `ram_mib`.
pub fn eval(expr: &str, ram_mib: f64) -> Result<f64, String> {
    eval_with(expr, ram_mib, &Vars::new())
}

/// Evaluates an expression with `ram` and the `set!` variables `vars` (`ram` cannot be
/// redefined: zram-generator looks it up first).
pub fn eval_with(expr: &str, ram_mib: f64, vars: &Vars) -> Result<f64, String> {
    let mut p = Parser { s: expr.as_bytes(), i: 0, ram: ram_mib, vars, depth: 0 };
    let v = p.sum()?;
    p.skip_ws();
    if p.i != p.s.len() {
        return Err(format!("`{expr}`: unexpected `{}`", &expr[p.i..]));
    }
    if !v.is_finite() {
        return Err(format!("`{expr}` is not a finite number"));
    }
    Ok(v)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    ram: f64,
    vars: &'a Vars,
    /// `unary` calls in progress: every recursion of the parser goes through `unary`.
    depth: u32,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn sum(&mut self) -> Result<f64, String> {
        let mut v = self.product()?;
        loop {
            if self.eat(b'+') {
                v += self.product()?;
            } else if self.eat(b'-') {
                v -= self.product()?;
            } else {
                return Ok(v);
            }
        }
    }
    fn product(&mut self) -> Result<f64, String> {
        let mut v = self.unary()?;
        loop {
            if self.eat(b'*') {
                v *= self.unary()?;
            } else if self.eat(b'/') {
                v /= self.unary()?;
            } else if self.eat(b'%') {
                v %= self.unary()?;
            } else {
                return Ok(v);
            }
        }
    }
    fn unary(&mut self) -> Result<f64, String> {
        if self.depth >= MAX_DEPTH {
            return Err(format!("the expression nests deeper than {MAX_DEPTH} levels"));
        }
        self.depth += 1;
        let v = if self.eat(b'-') {
            self.unary().map(|v| -v)
        } else if self.eat(b'+') {
            self.unary()
        } else {
            self.power()
        };
        self.depth -= 1;
        v
    }
    /// `a ^ b`, right-associative: `2 ^ 3 ^ 2` is `2 ^ 9`.
    fn power(&mut self) -> Result<f64, String> {
        let base = self.atom()?;
        if self.eat(b'^') {
            let exp = self.unary()?;
            return Ok(base.powf(exp));
        }
        Ok(base)
    }
    fn atom(&mut self) -> Result<f64, String> {
        self.skip_ws();
        for (open, close) in [(b'(', b')'), (b'[', b']')] {
            if self.eat(open) {
                let v = self.sum()?;
                return if self.eat(close) { Ok(v) } else { Err(format!("missing `{}`", close as char)) };
            }
        }
        let start = self.i;
        if self.s.get(self.i).is_some_and(|c| c.is_ascii_digit() || *c == b'.') {
            return self.number(start);
        }
        while self.i < self.s.len() && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_') {
            self.i += 1;
        }
        let word = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
        if word.is_empty() {
            return Err(format!("expected a number, a name or a function at offset {start}"));
        }
        self.skip_ws();
        if self.s.get(self.i) == Some(&b'(') {
            self.i += 1;
            let mut args = Vec::new();
            if !self.eat(b')') {
                loop {
                    args.push(self.sum()?);
                    if self.eat(b')') {
                        break;
                    }
                    if !self.eat(b',') {
                        return Err(format!("`{word}(` is not closed"));
                    }
                }
            }
            return call(word, &args);
        }
        match word {
            "ram" => Ok(self.ram),
            w => self.vars.get(w).copied().ok_or_else(|| format!("unknown name `{w}` (only `ram` and variables set with `set!`)")),
        }
    }
    /// Digits, an optional fraction and exponent, and an optional SI suffix.
    fn number(&mut self, start: usize) -> Result<f64, String> {
        while self.i < self.s.len() && (self.s[self.i].is_ascii_digit() || self.s[self.i] == b'.') {
            self.i += 1;
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E'))
            && self.s.get(self.i + 1).is_some_and(|c| c.is_ascii_digit() || *c == b'-' || *c == b'+')
        {
            self.i += 2;
            while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                self.i += 1;
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
        let v: f64 = text.parse().map_err(|_| format!("`{text}` is not a number"))?;
        let rest = &self.s[self.i..];
        let (scale, len) = match rest {
            [b'k' | b'K', ..] => (1e3, 1),
            [b'M', ..] => (1e6, 1),
            [b'G', ..] => (1e9, 1),
            [b'T', ..] => (1e12, 1),
            [b'm', ..] => (1e-3, 1),
            [b'u', ..] => (1e-6, 1),
            [0xc2, 0xb5, ..] => (1e-6, 2), // µ
            [b'n', ..] => (1e-9, 1),
            _ => (1.0, 0),
        };
        self.i += len;
        if self.s.get(self.i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') {
            return Err(format!("`{}` is not a number", String::from_utf8_lossy(&self.s[start..=self.i])));
        }
        Ok(v * scale)
    }
}

/// A built-in function of fasteval's, applied.
fn call(name: &str, a: &[f64]) -> Result<f64, String> {
    let one = |f: fn(f64) -> f64| match a {
        [x] => Ok(f(*x)),
        _ => Err(format!("`{name}` takes one argument, not {}", a.len())),
    };
    match name {
        "min" | "max" if a.is_empty() => Err(format!("`{name}` needs at least one argument")),
        "min" => Ok(a.iter().copied().fold(f64::INFINITY, f64::min)),
        "max" => Ok(a.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
        "e" | "pi" if !a.is_empty() => Err(format!("`{name}()` takes no arguments")),
        "e" => Ok(std::f64::consts::E),
        "pi" => Ok(std::f64::consts::PI),
        "int" => one(f64::trunc),
        "ceil" => one(f64::ceil),
        "floor" => one(f64::floor),
        "abs" => one(f64::abs),
        "sign" => one(|x| if x == 0.0 { 0.0 } else { x.signum() }),
        "round" | "log" => {
            let (first, x) = match a {
                [x] => (if name == "log" { 10.0 } else { 1.0 }, *x),
                [m, x] => (*m, *x),
                _ => return Err(format!("`{name}` takes one or two arguments, not {}", a.len())),
            };
            Ok(if name == "log" { x.log(first) } else { (x / first).round() * first })
        }
        "sin" => one(f64::sin),
        "cos" => one(f64::cos),
        "tan" => one(f64::tan),
        "asin" => one(f64::asin),
        "acos" => one(f64::acos),
        "atan" => one(f64::atan),
        "sinh" => one(f64::sinh),
        "cosh" => one(f64::cosh),
        "tanh" => one(f64::tanh),
        "asinh" => one(f64::asinh),
        "acosh" => one(f64::acosh),
        "atanh" => one(f64::atanh),
        _ => Err(format!("unknown function `{name}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_expressions_evaluate_as_zram_generator_does() {
        assert_eq!(eval("min(ram / 2, 4096)", 2048.0).unwrap(), 1024.0);
        assert_eq!(eval("min(ram / 2, 4096)", 16384.0).unwrap(), 4096.0);
        assert_eq!(eval("ram", 300.0).unwrap(), 300.0);
        assert_eq!(eval("min(ram * 2, 4096)", 300.0).unwrap(), 600.0);
        assert_eq!(eval("max(512, ram / 4) + 1", 1024.0).unwrap(), 513.0);
        assert_eq!(eval("-(2 - 8) * 2", 0.0).unwrap(), 12.0);
        assert_eq!(eval("4096", 1.0).unwrap(), 4096.0);
        assert!(eval("ram +", 1.0).is_err());
        assert!(eval("disk", 1.0).unwrap_err().contains("unknown name"));
        assert!(eval("ram / 0", 1.0).is_err());
        // zram-generator's own tests: SI suffixes are decimal multipliers of MiB.
        assert_eq!(eval("500k", 5000.0).unwrap(), 500e3);
        assert_eq!(eval("32G", 5000.0).unwrap(), 32e9);
        assert_eq!(eval("0.5 * ram", 100.0).unwrap(), 50.0);
        assert_eq!(eval("min(0.5 * ram, 4000)", 3000.0).unwrap(), 1500.0);
        assert!(eval("(ram-100)/0", 100.0).is_err(), "NaN");
    }

    #[test]
    fn the_rest_of_fastevals_language() {
        assert_eq!(eval("2 ^ 3 ^ 2", 0.0).unwrap(), 512.0);
        assert_eq!(eval("ram % 1000", 4096.0).unwrap(), 96.0);
        assert_eq!(eval("[ram + 1] * 2", 1.0).unwrap(), 4.0);
        assert_eq!(eval("min(5, 1, 3) + max(2)", 0.0).unwrap(), 3.0);
        assert_eq!(eval("int(7.9) + ceil(0.1) + floor(-0.5) + abs(-2) + sign(-3)", 0.0).unwrap(), 7.0 + 1.0 - 1.0 + 2.0 - 1.0);
        assert_eq!(eval("round(1.5) + round(0.25, 1.3)", 0.0).unwrap(), 2.0 + 1.25);
        assert_eq!(eval("log(1000) + log(2, 8)", 0.0).unwrap(), 6.0);
        assert!((eval("e() + pi() + sin(0) + cos(0)", 0.0).unwrap() - (std::f64::consts::E + std::f64::consts::PI + 1.0)).abs() < 1e-12);
        assert_eq!(eval("1e3 + 2m", 0.0).unwrap(), 1000.002);
        assert!(eval("min()", 0.0).is_err() && eval("e(1)", 0.0).is_err() && eval("frob(1)", 0.0).is_err());
        assert!(eval("2kb", 0.0).is_err() && eval("ram < 2", 1.0).is_err());
    }

    #[test]
    fn variables_from_set_directives() {
        let vars: Vars = [("two".to_string(), 2.0), ("ram".to_string(), 9.0)].into_iter().collect();
        assert_eq!(eval_with("0.5 * ram * two", 100.0, &vars).unwrap(), 100.0, "`ram` is MemTotal, never a variable");
        assert!(eval_with("three", 100.0, &vars).unwrap_err().contains("set!"));
    }

    /// Deep nesting is an error, not a stack overflow that kills `compcache swapon`.
    #[test]
    fn deep_nesting_is_an_error() {
        for depth in [100_000, MAX_DEPTH as usize + 1] {
            let parens = "(".repeat(depth) + "1" + &")".repeat(depth);
            assert!(eval(&parens, 1.0).unwrap_err().contains("nests deeper"), "{depth} parentheses");
            assert!(eval(&("-".repeat(depth) + "1"), 1.0).unwrap_err().contains("nests deeper"), "{depth} minus signs");
            let mins = "min(1, ".repeat(depth) + "1" + &")".repeat(depth);
            assert!(eval(&mins, 1.0).unwrap_err().contains("nests deeper"), "{depth} min()");
            assert!(eval(&("2^".repeat(depth) + "1"), 1.0).unwrap_err().contains("nests deeper"), "{depth} powers");
        }
        let ok = "(".repeat(MAX_DEPTH as usize - 1) + "ram" + &")".repeat(MAX_DEPTH as usize - 1);
        assert_eq!(eval(&ok, 7.0).unwrap(), 7.0);
        assert_eq!(eval("--3", 0.0).unwrap(), 3.0);
    }
}
