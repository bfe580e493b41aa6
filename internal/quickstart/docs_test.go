package quickstart_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docs/guarantees.md cites the tests that hold each guarantee; every test, fuzz test
// and benchmark it names must exist, so the page cannot point at something removed.
func TestGuaranteesCiteTestsThatExist(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../../docs/guarantees.md")
	require.NoError(t, err)
	defined := map[string]bool{}
	funcs := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)\w+)\(`)
	err = filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "_test.go") {
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range funcs.FindAllStringSubmatch(string(src), -1) {
				defined[m[1]] = true
			}
		}
		return nil
	})
	require.NoError(t, err)
	cited := regexp.MustCompile("`((?:Test|Fuzz|Benchmark)[A-Z]\\w*)")
	for _, m := range cited.FindAllStringSubmatch(string(page), -1) {
		require.True(t, defined[m[1]], "docs/guarantees.md cites %s, which no test file defines", m[1])
	}
}
