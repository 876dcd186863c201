//! The hook order is a contract (ARCHITECTURE.md): at a case's start the
//! substitute, then each interceptor in order; per reference call every
//! interceptor's `before_call`, the reference call, every `after_call` in
//! order, then the substitute's call; marked port outputs to every
//! interceptor in order; at the end every interceptor in order, each able
//! to turn the result into an error. Checked with recording hooks around
//! a case that calls the reference twice.

use std::sync::{Arc, Mutex};

use conformance::case::{Backend, Case, CaseOutput};
use conformance::hooks::{
    Answer, Counterpart, Hooks, Interceptor, ReferenceCall, Substitute, SubstituteError,
};
use conformance::result::{CaseResult, ErrorKind, Verdict};
use conformance::runner::{self, RunOptions};
use oracle::{DType, HostTensor, Oracle, Value};

type Log = Arc<Mutex<Vec<String>>>;

struct Recorder {
    tag: &'static str,
    log: Log,
    /// Turns the result into an error at the case's end.
    fails_at_end: bool,
}

impl Recorder {
    fn note(&self, what: String) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}:{what}", self.tag));
    }
}

impl Interceptor for Recorder {
    fn case_start(&self, case: &Case) {
        self.note(format!("start {}", case.name));
    }
    fn before_call(&self, _backend: Backend) {
        self.note("before".into());
    }
    fn after_call(&self, call: &ReferenceCall<'_>) {
        self.note(format!(
            "after {} ok={}",
            call.function,
            call.result.is_ok()
        ));
    }
    fn port_output(&self, family: &str, m: usize, n: usize, _y: &mut HostTensor) {
        self.note(format!("port {family} {m} {n}"));
    }
    fn case_end(&self, _case: &Case, result: &mut CaseResult) {
        self.note(format!("end {}", result.verdict.word()));
        if self.fails_at_end {
            result.verdict = Verdict::Error;
            result.error_kind = Some(ErrorKind::Harness);
        }
    }
}

/// Answers every call with the reference's own array.
struct Echo {
    log: Log,
    last: Mutex<Option<HostTensor>>,
}

impl Substitute for Echo {
    fn case_start(&self) {
        self.log.lock().unwrap().push("sub:start".into());
    }
    fn sends(&self, _function: &str) -> bool {
        true
    }
    fn call(
        &self,
        _case: &str,
        function: &'static str,
        _args: &[(&str, oracle::Arg)],
        reference: Option<&Value>,
    ) -> Result<Answer, SubstituteError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("sub:call {function}"));
        if let Some(Value::Tensor(t)) = reference {
            *self.last.lock().unwrap() = Some(t.clone());
        }
        Ok(Answer::Computed)
    }
    fn counterparts_of(&self, _t: &HostTensor) -> Option<Vec<Counterpart>> {
        let last = self.last.lock().unwrap().clone()?;
        Some(vec![Ok(last)])
    }
    fn values_beside(&self, _v: &Value) -> Option<Vec<Result<Value, String>>> {
        None
    }
    fn last_raised(&self) -> Option<bool> {
        Some(false)
    }
}

fn case() -> Case {
    Case::must_equal("t/echo-twice", "t", "none", |ctx| {
        let mut out = CaseOutput::new("-");
        for (name, byte) in [("a", 7u8), ("b", 9)] {
            let mut t = HostTensor::new(DType::Uint8, vec![1], vec![byte]).unwrap();
            let expected = conformance::reference::selftest::echo(ctx, &t)?;
            ctx.port_output("t", 1, 1, &mut t);
            out.compare(name, &t, &expected);
        }
        Ok(out)
    })
}

fn run(hooks: &Hooks) -> CaseResult {
    let oracle = Oracle::start().unwrap();
    let cases = [case()];
    let selected: Vec<&Case> = cases.iter().collect();
    let options = RunOptions {
        backend: Backend::Cpu,
        seed: 0,
        jobs: 1,
        perturb: false,
    };
    let mut results = runner::run_hooked(&selected, &oracle, &options, hooks, &|_| {});
    assert_eq!(results.len(), 1);
    results.remove(0)
}

#[test]
fn hooks_are_called_in_the_documented_order() {
    let log: Log = Arc::default();
    let recorder = |tag, fails_at_end| {
        Box::new(Recorder {
            tag,
            log: Arc::clone(&log),
            fails_at_end,
        }) as Box<dyn Interceptor>
    };
    let hooks = Hooks {
        interceptors: vec![recorder("A", false), recorder("B", true)],
        substitute: Some(Box::new(Echo {
            log: Arc::clone(&log),
            last: Mutex::new(None),
        })),
    };
    let result = run(&hooks);
    let call = [
        "A:before",
        "B:before",
        "A:after echo ok=true",
        "B:after echo ok=true",
        "sub:call echo",
        "A:port t 1 1",
        "B:port t 1 1",
    ];
    let mut expected = vec!["sub:start", "A:start t/echo-twice", "B:start t/echo-twice"];
    expected.extend(call);
    expected.extend(call);
    // B sees A's verdict, and turns it into an error after A has seen it.
    expected.extend(["A:end pass", "B:end pass"]);
    assert_eq!(*log.lock().unwrap(), expected);
    assert_eq!(result.verdict, Verdict::Error);
    assert_eq!(result.error_kind, Some(ErrorKind::Harness));
}

#[test]
fn a_substitute_that_does_not_serve_an_op_makes_an_unsupported_skip() {
    struct Refuses;
    impl Substitute for Refuses {
        fn sends(&self, _function: &str) -> bool {
            true
        }
        fn call(
            &self,
            _case: &str,
            _function: &'static str,
            _args: &[(&str, oracle::Arg)],
            _reference: Option<&Value>,
        ) -> Result<Answer, SubstituteError> {
            Err(SubstituteError::Unsupported("not served".into()))
        }
        fn counterparts_of(&self, _t: &HostTensor) -> Option<Vec<Counterpart>> {
            None
        }
        fn values_beside(&self, _v: &Value) -> Option<Vec<Result<Value, String>>> {
            None
        }
        fn last_raised(&self) -> Option<bool> {
            None
        }
    }
    let result = run(&Hooks {
        interceptors: Vec::new(),
        substitute: Some(Box::new(Refuses)),
    });
    assert_eq!(result.verdict, Verdict::Skip);
    assert_eq!(result.error_kind, Some(ErrorKind::Unsupported));
    assert!(
        result
            .message
            .as_deref()
            .unwrap_or("")
            .contains("not served"),
        "{result:?}"
    );
}
