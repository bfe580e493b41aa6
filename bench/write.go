package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// A writeCase is one shape of business transaction: how many messages it sends and
// how many writers run it at once.
type writeCase struct {
	Name    string
	Msgs    int
	Writers int
	Target  float64 // at most this multiple of the business transaction alone
}

var writeCases = []writeCase{
	{Name: "+1 message, 1 writer", Msgs: 1, Writers: 1, Target: 1.15},
	{Name: "+10 messages, 1 writer", Msgs: 10, Writers: 1, Target: 1.8},
	{Name: "+1 message, 8 writers", Msgs: 1, Writers: 8, Target: 1.4},
}

// writeResult is one database's write-cost table: per case and contender, the mean
// µs per transaction of every repetition and its multiple of the business
// transaction in the same repetition.
type writeResult struct {
	DB          string
	Contenders  []string
	Cases       []writeCase
	TxPerWriter map[int]int          // transactions per writer, by writer count
	Micros      map[string][]float64 // case/contender → per repetition
	Ratio       map[string][]float64
	Checks      map[string]*checks // by contender
}

func wkey(c writeCase, contender string) string { return c.Name + "/" + contender }

func writeScenario(ctx context.Context, e *env, db string, contenders []contender, sz sizes, reps int) (*writeResult, error) {
	res := &writeResult{DB: db, Cases: writeCases, TxPerWriter: map[int]int{1: sz.writeTx, 8: sz.writeTxEach},
		Micros: map[string][]float64{}, Ratio: map[string][]float64{}, Checks: map[string]*checks{}}
	for _, c := range contenders {
		res.Contenders = append(res.Contenders, c.name)
		if c.name != business.name {
			res.Checks[c.name] = &checks{}
		}
	}
	for _, wc := range writeCases {
		txs := res.TxPerWriter[wc.Writers]
		for rep := range reps {
			var base float64
			for _, c := range contenders {
				us, ch, err := writeOne(ctx, e, c, wc, txs)
				if err != nil {
					return nil, fmt.Errorf("write %s, %s, %s, rep %d: %w", db, wc.Name, c.name, rep+1, err)
				}
				if c.name == business.name {
					base = us
				} else {
					res.Checks[c.name].add(ch)
				}
				k := wkey(wc, c.name)
				res.Micros[k] = append(res.Micros[k], us)
				res.Ratio[k] = append(res.Ratio[k], us/base)
				say("write %s | %-24s | rep %d | %-18s | %8.1f µs/tx  %.2f×", db, wc.Name, rep+1, c.name, us, us/base)
			}
		}
	}
	return res, nil
}

// writeOne runs txs business transactions per writer, after a few untimed ones to
// warm the connections, and returns the mean µs per transaction. Then a relay
// publishes what was written and the delivery is checked.
func writeOne(ctx context.Context, e *env, c contender, wc writeCase, txs int) (float64, check, error) {
	s, err := open(ctx, e, c)
	if err != nil {
		return 0, check{}, err
	}
	defer s.close(ctx)
	p := newPlan(wc.Writers)
	warm := max(10, txs/20)
	msgs := c.name != business.name
	// Every message is built before the clock starts.
	work := make([][][]message, wc.Writers)
	for w := range work {
		work[w] = make([][]message, warm+txs)
		if msgs {
			for i := range work[w] {
				work[w][i] = p.next(w, wc.Msgs)
			}
		}
	}
	var order atomic.Int64
	tx := func(w, i int) error {
		_, err := s.in.write(ctx, order.Add(1), work[w][i])
		return err
	}
	for w := range wc.Writers {
		for i := range warm {
			if err := tx(w, i); err != nil {
				return 0, check{}, err
			}
		}
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, wc.Writers)
	for w := range wc.Writers {
		wg.Go(func() {
			for i := warm; i < warm+txs; i++ {
				start := time.Now()
				if err := tx(w, i); err != nil {
					errs[w] = err
					return
				}
				total.Add(int64(time.Since(start)))
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, check{}, err
		}
	}
	us := float64(total.Load()) / float64(wc.Writers*txs) / 1e3
	if !msgs {
		return us, check{}, nil
	}
	ch, err := s.deliver(ctx, p, 500)
	return us, ch, err
}
