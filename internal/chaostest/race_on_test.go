//go:build race

package chaostest

// raceEnabled: the tests run under the race detector, so the relay binary is built
// with it too (it reuses the packages the test build compiled, and checks the relay).
const raceEnabled = true
