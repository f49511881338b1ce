# frozen_string_literal: true

require "test_helper"

# The pure-Ruby loop's timer heap (Evt::SelectLoop::Timers), which must be ext/evt/timers.c's
# algorithm: a binary min-heap whose timers know their index, removal by that index at once, equal
# deadlines in the order they were added. The hooks cannot make two deadlines equal to the
# nanosecond (test/loop_parity_test.rb compares the two loops through them), so ties are checked here.
class SelectTimersTest < Minitest::Test
  Timers = Evt::SelectLoop::Timers

  # Takes the timers out earliest first, as the loop fires them.
  def drain(timers)
    fired = []
    while (timer = timers.first)
      timers.remove(timer)
      fired << timer.target
    end
    fired
  end

  # Every timer's index is its position, and no child is earlier than its parent.
  def assert_heap(timers)
    heap = []
    timers.each { |timer| heap << timer }
    heap.each_with_index do |timer, i|
      assert_equal i, timer.index, "a timer does not know its place"
      next if i.zero?

      parent = heap[(i - 1) / 2]
      assert_operator ([parent.deadline, parent.sequence] <=> [timer.deadline, timer.sequence]), :<, 0, "heap order broken at #{i}"
    end
  end

  def test_equal_deadlines_fire_in_the_order_they_were_added
    timers = Timers.new
    %i[a b c d e f g h].each { |name| timers.add(100, name) }
    timers.add(50, :early)
    timers.add(150, :late)
    assert_equal %i[early a b c d e f g h late], drain(timers)
  end

  def test_a_removed_timer_leaves_at_once_and_nothing_is_left_behind
    timers = Timers.new
    added = Array.new(20) { |i| timers.add(i % 7, i) }
    [added[0], added[19], added[10], added[3]].each do |timer|
      timers.remove(timer)
      assert_nil timer.index
      assert_heap(timers)
    end
    assert_equal 16, timers.size
    timers.remove(added[10]) # again: nothing
    assert_equal 16, timers.size
    expected = (added - [added[0], added[19], added[10], added[3]]).sort_by { |t| [t.deadline, t.sequence] }.map(&:target)
    assert_equal expected, drain(timers)
    assert_nil timers.first
  end

  def test_removing_the_last_and_the_only_timer
    timers = Timers.new
    only = timers.add(5, :only)
    timers.remove(only)
    assert_nil timers.first
    a = timers.add(1, :a)
    b = timers.add(2, :b)
    timers.remove(b)
    assert_equal [a], [timers.first]
    assert_heap(timers)
  end

  def test_clear_leaves_every_timer_out
    timers = Timers.new
    added = Array.new(5) { |i| timers.add(i, i) }
    timers.clear
    assert(added.all? { |timer| timer.index.nil? })
    assert_nil timers.first
    timers.remove(added[2]) # a cleared timer: nothing
    later = timers.add(1, :later)
    assert_equal [later], [timers.first]
  end

  # Random adds and removals, many equal deadlines among them, against a sorted list.
  def test_random_operations_match_a_sorted_list
    random = Random.new(2024)
    timers = Timers.new
    model = []
    2000.times do
      if model.empty? || random.rand < 0.55
        timer = timers.add(random.rand(40), model.size)
        model << timer
      else
        timer = random.rand < 0.3 ? model.min_by { |t| [t.deadline, t.sequence] } : model.sample(random: random)
        assert_same timer, timers.first if timer.equal?(model.min_by { |t| [t.deadline, t.sequence] })
        timers.remove(timer)
        model.delete(timer)
      end
      assert_equal model.size, timers.size
    end
    assert_heap(timers)
    assert_equal model.sort_by { |t| [t.deadline, t.sequence] }.map(&:target), drain(timers)
  end
end
