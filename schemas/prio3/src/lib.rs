//! Prio3 (draft-irtf-cfrg-vdaf-18, §7) from the `prio` crate, exposed to Python as `esa_prio3`.
//!
//! Every value crosses the boundary in the draft's wire encoding: bytes in, bytes out. All field
//! arithmetic, proofs (FLPs, §7.3) and XOFs are the crate's; this file only decodes, calls and
//! encodes. One class per VDAF type; every class has the same methods:
//!
//! * `shard(measurement, nonce, rand=None)` -> `(public_share, [input_share, ...])` (§5.1)
//! * `verify_init(verify_key, agg_id, nonce, public_share, input_share)` -> `(state, verifier_share)`
//! * `verifier_shares_to_message(agg_id, state, [verifier_share, ...])` -> `verifier_message`
//! * `verify_next(agg_id, state, verifier_message)` -> `output_share` (§5.2)
//! * `aggregate_init()`, `aggregate([output_share, ...])`, `merge([aggregate_share, ...])` (§5.3)
//! * `unshard([aggregate_share, ...], num_measurements)` -> `[int, ...]` (§5.4)
//!
//! Failures (a malformed encoding, a proof that does not verify, a joint-randomness mismatch)
//! raise `ValueError` naming the step. The heavy calls release the GIL.

use prio::codec::{Encode, ParameterizedDecode};
use prio::field::Field128;
use prio::flp::gadgets::{Mul, ParallelSum};
use prio::flp::types::{
    Histogram as HistogramFlp, MultihotCountVec as MultihotCountVecFlp, SumVec as SumVecFlp,
};
use prio::flp::Type;
use prio::vdaf::prio3::{
    optimal_chunk_length, Prio3, Prio3Histogram, Prio3InputShare, Prio3MultihotCountVec,
    Prio3PublicShare, Prio3SumVec, Prio3VerifierMessage, Prio3VerifierShare, Prio3VerifyState,
};
use prio::vdaf::test_utils::TestVectorClient;
use prio::vdaf::xof::XofTurboShake128;
use prio::vdaf::{
    Aggregatable, AggregateShare, Aggregator, Client, Collector, OutputShare, Vdaf,
    VerifyTransition,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// VERIFY_KEY_SIZE of every Prio3 instance here (XofTurboShake128 seeds, §6.2.1).
const SEED_SIZE: usize = 32;
/// NONCE_SIZE of Prio3 (§7).
const NONCE_SIZE: usize = 16;

fn value_error(step: &str) -> impl Fn(&dyn std::fmt::Display) -> PyErr + '_ {
    move |e| PyValueError::new_err(format!("{step}: {e}"))
}

fn fixed<const N: usize>(bytes: &[u8], what: &str) -> PyResult<[u8; N]> {
    bytes.try_into().map_err(|_| {
        PyValueError::new_err(format!("{what} must be {N} bytes, got {}", bytes.len()))
    })
}

/// The operations shared by every Prio3 type over Field128 with TurboSHAKE128.
struct Core<T: Type<Field = Field128>> {
    vdaf: Prio3<T, XofTurboShake128, SEED_SIZE>,
    ctx: Vec<u8>,
}

impl<T: Type<Field = Field128>> Core<T> {
    fn agg_id(&self, agg_id: usize) -> PyResult<usize> {
        if agg_id < self.vdaf.num_aggregators() {
            Ok(agg_id)
        } else {
            Err(PyValueError::new_err(format!(
                "agg_id must be below {}, got {agg_id}",
                self.vdaf.num_aggregators()
            )))
        }
    }

    /// RAND_SIZE (§7.2): every type here has joint randomness, so two seeds per aggregator.
    fn rand_size(&self) -> usize {
        2 * self.vdaf.num_aggregators() * SEED_SIZE
    }

    fn shard(
        &self,
        measurement: &T::Measurement,
        nonce: &[u8],
        rand: Option<&[u8]>,
    ) -> PyResult<(Vec<u8>, Vec<Vec<u8>>)> {
        let nonce: [u8; NONCE_SIZE] = fixed(nonce, "nonce")?;
        let (public_share, input_shares) = match rand {
            Some(rand) => {
                if rand.len() != self.rand_size() {
                    return Err(PyValueError::new_err(format!(
                        "rand must be {} bytes, got {}",
                        self.rand_size(),
                        rand.len()
                    )));
                }
                self.vdaf
                    .shard_with_random(&self.ctx, measurement, &nonce, rand)
            }
            None => self.vdaf.shard(&self.ctx, measurement, &nonce),
        }
        .map_err(|e| value_error("shard")(&e))?;
        let encode = value_error("encode");
        let public_share = public_share.get_encoded().map_err(|e| encode(&e))?;
        let input_shares = input_shares
            .iter()
            .map(|share| share.get_encoded().map_err(|e| encode(&e)))
            .collect::<PyResult<Vec<_>>>()?;
        Ok((public_share, input_shares))
    }

    fn decode_state(
        &self,
        agg_id: usize,
        state: &[u8],
    ) -> PyResult<Prio3VerifyState<Field128, SEED_SIZE>> {
        Prio3VerifyState::get_decoded_with_param(&(&self.vdaf, agg_id), state)
            .map_err(|e| value_error("decode verify state")(&e))
    }

    fn verify_init(
        &self,
        verify_key: &[u8],
        agg_id: usize,
        nonce: &[u8],
        public_share: &[u8],
        input_share: &[u8],
    ) -> PyResult<(Vec<u8>, Vec<u8>)> {
        let verify_key: [u8; SEED_SIZE] = fixed(verify_key, "verify_key")?;
        let nonce: [u8; NONCE_SIZE] = fixed(nonce, "nonce")?;
        let agg_id = self.agg_id(agg_id)?;
        let public_share =
            Prio3PublicShare::<SEED_SIZE>::get_decoded_with_param(&self.vdaf, public_share)
                .map_err(|e| value_error("decode public share")(&e))?;
        let input_share = Prio3InputShare::<Field128, SEED_SIZE>::get_decoded_with_param(
            &(&self.vdaf, agg_id),
            input_share,
        )
        .map_err(|e| value_error("decode input share")(&e))?;
        let (state, verifier_share) = self
            .vdaf
            .verify_init(
                &verify_key,
                &self.ctx,
                agg_id,
                &(),
                &nonce,
                &public_share,
                &input_share,
            )
            .map_err(|e| value_error("verify_init")(&e))?;
        let encode = value_error("encode");
        Ok((
            state.get_encoded().map_err(|e| encode(&e))?,
            verifier_share.get_encoded().map_err(|e| encode(&e))?,
        ))
    }

    fn verifier_shares_to_message(
        &self,
        agg_id: usize,
        state: &[u8],
        verifier_shares: &[Vec<u8>],
    ) -> PyResult<Vec<u8>> {
        let agg_id = self.agg_id(agg_id)?;
        let state = self.decode_state(agg_id, state)?;
        let shares = verifier_shares
            .iter()
            .map(|share| {
                Prio3VerifierShare::<Field128, SEED_SIZE>::get_decoded_with_param(&state, share)
                    .map_err(|e| value_error("decode verifier share")(&e))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let message = self
            .vdaf
            .verifier_shares_to_message(&self.ctx, &(), shares)
            .map_err(|e| value_error("verifier_shares_to_message")(&e))?;
        message.get_encoded().map_err(|e| value_error("encode")(&e))
    }

    fn verify_next(&self, agg_id: usize, state: &[u8], message: &[u8]) -> PyResult<Vec<u8>> {
        let agg_id = self.agg_id(agg_id)?;
        let state = self.decode_state(agg_id, state)?;
        let message = Prio3VerifierMessage::<SEED_SIZE>::get_decoded_with_param(&state, message)
            .map_err(|e| value_error("decode verifier message")(&e))?;
        match self
            .vdaf
            .verify_next(&self.ctx, state, message)
            .map_err(|e| value_error("verify_next")(&e))?
        {
            VerifyTransition::Finish(output_share) => output_share
                .get_encoded()
                .map_err(|e| value_error("encode")(&e)),
            VerifyTransition::Continue(..) => Err(PyValueError::new_err(
                "verify_next: Prio3 verifies in one round, the crate asked for another",
            )),
        }
    }

    fn decode_aggregate_share(&self, share: &[u8]) -> PyResult<AggregateShare<Field128>> {
        AggregateShare::get_decoded_with_param(&(&self.vdaf, &()), share)
            .map_err(|e| value_error("decode aggregate share")(&e))
    }

    fn aggregate(&self, output_shares: &[Vec<u8>]) -> PyResult<Vec<u8>> {
        let shares = output_shares
            .iter()
            .map(|share| {
                OutputShare::<Field128>::get_decoded_with_param(&(&self.vdaf, &()), share)
                    .map_err(|e| value_error("decode output share")(&e))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let aggregate = self
            .vdaf
            .aggregate(&(), shares)
            .map_err(|e| value_error("aggregate")(&e))?;
        aggregate
            .get_encoded()
            .map_err(|e| value_error("encode")(&e))
    }

    fn merge(&self, aggregate_shares: &[Vec<u8>]) -> PyResult<Vec<u8>> {
        let mut total = self.vdaf.aggregate_init(&());
        for share in aggregate_shares {
            total
                .merge(&self.decode_aggregate_share(share)?)
                .map_err(|e| value_error("merge")(&e))?;
        }
        total.get_encoded().map_err(|e| value_error("encode")(&e))
    }

    fn unshard(&self, aggregate_shares: &[Vec<u8>], num_measurements: usize) -> PyResult<Vec<u128>>
    where
        T: Type<AggregateResult = Vec<u128>>,
    {
        if aggregate_shares.len() != self.vdaf.num_aggregators() {
            return Err(PyValueError::new_err(format!(
                "unshard needs {} aggregate shares, got {}",
                self.vdaf.num_aggregators(),
                aggregate_shares.len()
            )));
        }
        let shares = aggregate_shares
            .iter()
            .map(|share| self.decode_aggregate_share(share))
            .collect::<PyResult<Vec<_>>>()?;
        self.vdaf
            .unshard(&(), shares, num_measurements)
            .map_err(|e| value_error("unshard")(&e))
    }
}

fn chunk_length_or_optimal(chunk_length: Option<usize>, measurement_length: usize) -> usize {
    chunk_length.unwrap_or_else(|| optimal_chunk_length(measurement_length))
}

/// The methods every class has; `$measurement` is what `shard` accepts from Python.
macro_rules! prio3_class {
    ($class:ident, $flp:ty, $measurement:ty, $doc:literal, { $($constructor:tt)* }) => {
        #[doc = $doc]
        #[pyclass(frozen, module = "esa_prio3")]
        pub struct $class {
            core: Core<$flp>,
        }

        #[pymethods]
        impl $class {
            $($constructor)*

            /// Number of aggregators (SHARES).
            #[getter]
            fn num_aggregators(&self) -> usize {
                self.core.vdaf.num_aggregators()
            }

            /// Bytes of a verify key (VERIFY_KEY_SIZE).
            #[getter]
            fn verify_key_size(&self) -> usize {
                SEED_SIZE
            }

            /// Bytes of a nonce (NONCE_SIZE).
            #[getter]
            fn nonce_size(&self) -> usize {
                NONCE_SIZE
            }

            /// Bytes of sharding randomness (RAND_SIZE).
            #[getter]
            fn rand_size(&self) -> usize {
                self.core.rand_size()
            }

            /// Field elements of an output or aggregate share (OUTPUT_LEN).
            #[getter]
            fn output_len(&self) -> usize {
                self.core.vdaf.output_len()
            }

            /// The application context string bound into every XOF call.
            #[getter]
            fn ctx<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
                PyBytes::new(py, &self.core.ctx)
            }

            /// Shards a measurement: the public share and one input share per aggregator. Without
            /// `rand` the crate draws RAND_SIZE bytes from the operating system.
            #[pyo3(signature = (measurement, nonce, rand=None))]
            fn shard<'py>(
                &self,
                py: Python<'py>,
                measurement: $measurement,
                nonce: &[u8],
                rand: Option<&[u8]>,
            ) -> PyResult<(Bound<'py, PyBytes>, Vec<Bound<'py, PyBytes>>)> {
                let (public_share, input_shares) =
                    py.detach(|| self.core.shard(&measurement, nonce, rand))?;
                Ok((
                    PyBytes::new(py, &public_share),
                    input_shares.iter().map(|share| PyBytes::new(py, share)).collect(),
                ))
            }

            /// One aggregator's first step: its verification state and verifier share.
            fn verify_init<'py>(
                &self,
                py: Python<'py>,
                verify_key: &[u8],
                agg_id: usize,
                nonce: &[u8],
                public_share: &[u8],
                input_share: &[u8],
            ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
                let (state, verifier_share) = py.detach(|| {
                    self.core
                        .verify_init(verify_key, agg_id, nonce, public_share, input_share)
                })?;
                Ok((PyBytes::new(py, &state), PyBytes::new(py, &verifier_share)))
            }

            /// Combines all aggregators' verifier shares and decides the proof; raises
            /// ValueError when it does not verify.
            fn verifier_shares_to_message<'py>(
                &self,
                py: Python<'py>,
                agg_id: usize,
                state: &[u8],
                verifier_shares: Vec<Vec<u8>>,
            ) -> PyResult<Bound<'py, PyBytes>> {
                let message = py.detach(|| {
                    self.core
                        .verifier_shares_to_message(agg_id, state, &verifier_shares)
                })?;
                Ok(PyBytes::new(py, &message))
            }

            /// Checks the joint randomness and returns this aggregator's output share.
            fn verify_next<'py>(
                &self,
                py: Python<'py>,
                agg_id: usize,
                state: &[u8],
                verifier_message: &[u8],
            ) -> PyResult<Bound<'py, PyBytes>> {
                let output_share =
                    py.detach(|| self.core.verify_next(agg_id, state, verifier_message))?;
                Ok(PyBytes::new(py, &output_share))
            }

            /// The aggregate share of no reports (all zeros).
            fn aggregate_init<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
                let share = self.core.merge(&[])?;
                Ok(PyBytes::new(py, &share))
            }

            /// Sums output shares into one aggregate share.
            fn aggregate<'py>(
                &self,
                py: Python<'py>,
                output_shares: Vec<Vec<u8>>,
            ) -> PyResult<Bound<'py, PyBytes>> {
                let share = py.detach(|| self.core.aggregate(&output_shares))?;
                Ok(PyBytes::new(py, &share))
            }

            /// Sums aggregate shares (of disjoint report sets) into one.
            fn merge<'py>(
                &self,
                py: Python<'py>,
                aggregate_shares: Vec<Vec<u8>>,
            ) -> PyResult<Bound<'py, PyBytes>> {
                let share = py.detach(|| self.core.merge(&aggregate_shares))?;
                Ok(PyBytes::new(py, &share))
            }

            /// Adds every aggregator's aggregate share and decodes the aggregate result.
            fn unshard(
                &self,
                py: Python<'_>,
                aggregate_shares: Vec<Vec<u8>>,
                num_measurements: usize,
            ) -> PyResult<Vec<u128>> {
                py.detach(|| self.core.unshard(&aggregate_shares, num_measurements))
            }
        }
    };
}

fn new_core<T: Type<Field = Field128>>(
    vdaf: Result<Prio3<T, XofTurboShake128, SEED_SIZE>, prio::vdaf::VdafError>,
    ctx: Vec<u8>,
) -> PyResult<Core<T>> {
    Ok(Core {
        vdaf: vdaf.map_err(|e| value_error("parameters")(&e))?,
        ctx,
    })
}

prio3_class!(
    Histogram,
    HistogramFlp<Field128, ParallelSum<Field128, Mul>>,
    usize,
    "Prio3Histogram (§7.4.4): a measurement is one index in [0, length); the aggregate counts each.",
    {
        #[new]
        #[pyo3(signature = (length, chunk_length=None, num_aggregators=2, ctx=Vec::new()))]
        fn new(
            length: usize,
            chunk_length: Option<usize>,
            num_aggregators: u8,
            ctx: Vec<u8>,
        ) -> PyResult<Self> {
            let chunk_length = chunk_length_or_optimal(chunk_length, length);
            Ok(Self {
                core: new_core(
                    Prio3Histogram::new_histogram(num_aggregators, length, chunk_length),
                    ctx,
                )?,
            })
        }
    }
);

prio3_class!(
    MultihotCountVec,
    MultihotCountVecFlp<Field128, ParallelSum<Field128, Mul>>,
    Vec<bool>,
    "Prio3MultihotCountVec (§7.4.5): a measurement is `length` bits with at most `max_weight` set.",
    {
        #[new]
        #[pyo3(signature = (length, max_weight, chunk_length=None, num_aggregators=2, ctx=Vec::new()))]
        fn new(
            length: usize,
            max_weight: usize,
            chunk_length: Option<usize>,
            num_aggregators: u8,
            ctx: Vec<u8>,
        ) -> PyResult<Self> {
            // The encoded measurement is the bits plus the weight's bits (§7.4.5).
            let weight_bits = (usize::BITS - max_weight.leading_zeros()) as usize;
            let chunk_length = chunk_length_or_optimal(chunk_length, length + weight_bits);
            Ok(Self {
                core: new_core(
                    Prio3MultihotCountVec::new_multihot_count_vec(
                        num_aggregators,
                        length,
                        max_weight,
                        chunk_length,
                    ),
                    ctx,
                )?,
            })
        }
    }
);

prio3_class!(
    SumVec,
    SumVecFlp<Field128, ParallelSum<Field128, Mul>>,
    Vec<u128>,
    "Prio3SumVec (§7.4.3): a measurement is `length` integers in [0, max_measurement].",
    {
        #[new]
        #[pyo3(signature = (length, max_measurement, chunk_length=None, num_aggregators=2, ctx=Vec::new()))]
        fn new(
            length: usize,
            max_measurement: u128,
            chunk_length: Option<usize>,
            num_aggregators: u8,
            ctx: Vec<u8>,
        ) -> PyResult<Self> {
            let bits = (u128::BITS - max_measurement.leading_zeros()) as usize;
            let chunk_length = chunk_length_or_optimal(chunk_length, length * bits);
            Ok(Self {
                core: new_core(
                    Prio3SumVec::new_sum_vec(num_aggregators, max_measurement, length, chunk_length),
                    ctx,
                )?,
            })
        }
    }
);

/// The Python module `esa_prio3`.
#[pymodule]
fn esa_prio3(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("VDAF_DRAFT", 18)?;
    module.add("PRIO_CRATE_VERSION", "0.18.1")?;
    module.add_class::<Histogram>()?;
    module.add_class::<MultihotCountVec>()?;
    module.add_class::<SumVec>()?;
    Ok(())
}
